"""The tune's and the capacity stage's configs carry the settings they read: a tune's job config
stays short, neither holds the pipeline's comparison, repeat or goodput goals, and the configs they
build for the pipeline's steps are the pipeline's defaults where they hold nothing."""

from __future__ import annotations

import dataclasses

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from gpu_simulate_test.config.capacity import CapacityOptions, CapacityStageConfig
from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.registry import to_typed
from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.config.tune import CAPACITY_ONLY, TUNE_PROFILE, TuneStageConfig
from gpu_simulate_test.config.vidur import VidurConfig, VidurPredictorConfig

TUNE_JOB_LINES = 120  # the space names its two knobs it does not search (null)
"""Issue 61 (settings by composition): ``tune --cfg job`` lists at most this many ``key: value``
lines (208 when the tune inherited the pipeline's whole config; 103 then, and since issue 62 the
fleet's ``tune.target_qps``; 109 with where the search runs: ``tune.workers``, ``executor``,
``ray_address``; 111 with the vLLM backend's ``servers`` and ``router``; 112 with its
``gpu_memory_utilization``; 115 with the three knobs' old names, unset, accepted only to be
refused naming vLLM's, :mod:`gpu_simulate_test.config.renamed`; 116 with
``tune.server_spread``, the tie between servers; 117 with ``vidur.busy_spread``, a busy
step's measured tail, which acts at the tune's high-concurrency capacities; 118 with
``tune.sim_seeds``, the noise seeds each configuration is searched under)."""
PIPELINE_ONLY = ("compare", "goodput", "real_repeat")
"""The pipeline's own settings, which no search reads (it judges by ``capacity.slo``)."""
CAPACITY_ONLY_KEYS = (
    "step_band",
    "sim_seeds",
    "verify",
    "verify_seed",
    "verify_probe_requests",
    "phase",
)


def _lines(composed: object) -> list[str]:
    return [line for line in OmegaConf.to_yaml(composed).splitlines() if ": " in line]


def test_the_tunes_job_config_is_short(compose_stage) -> None:
    composed = compose_stage("tune")
    assert len(_lines(composed)) <= TUNE_JOB_LINES
    # the simulator's scheduler is each configuration's own; the profile's ranges the tune's
    assert set(composed.vidur) == {"predictor", "step_jitter", "busy_spread", "seed"}
    assert "profile" not in composed and "profiling" not in composed
    assert not set(CAPACITY_ONLY_KEYS) & set(composed.capacity)


def test_no_search_holds_the_pipelines_own_settings(compose_stage) -> None:
    tune, capacity = compose_stage("tune"), compose_stage("capacity")
    for key in PIPELINE_ONLY:
        assert key not in tune and key not in capacity
        assert key not in TuneStageConfig.__dataclass_fields__
        assert key not in CapacityStageConfig.__dataclass_fields__
    shared = {
        "model", "hardware", "workload", "backend", "profiling_root", "reuse_profile",
        "accept_profile_warnings", "validate_calibration", "engine_overhead", "output", "progress",
    }  # fmt: skip
    assert set(tune) == shared | {"vidur", "capacity", "tune"}
    own = {"vidur", "profile", "profiling", "dtype", "attn_implementation", "num_warmup_requests",
           "fleet"}  # fmt: skip
    assert set(capacity) == shared | own | {"capacity"}


@pytest.mark.parametrize(
    "override",
    ["capacity.verify=search", "capacity.step_band=0.1", "profile.max_num_tokens=512",
     "vidur.scheduler.chunk_size=64", "goodput.ttft=100", "real_repeat=false"],
)  # fmt: skip
def test_a_setting_the_tune_never_reads_is_refused(compose_stage, override: str) -> None:
    with pytest.raises(ConfigCompositionException):
        compose_stage("tune", [override])


def test_every_knob_of_the_space_is_set_without_a_plus_and_a_null_one_is_not_searched(
    compose_stage,
) -> None:
    """docs/tune.md names five engine knobs; two the default space does not search needed
    Hydra's ``+`` (``Could not override 'tune.space.enable_chunked_prefill'``)."""
    default = to_typed(compose_stage("tune"), TuneStageConfig).tune.knobs()
    assert "enable_chunked_prefill" not in default and "num_gpu_blocks_override" not in default
    assert set(default) >= {"max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching"}
    overrides = ["tune.space.enable_chunked_prefill=[true,false]",
                 "tune.space.num_gpu_blocks_override=[256,512]"]  # fmt: skip
    knobs = to_typed(compose_stage("tune", overrides), TuneStageConfig).tune.knobs()
    assert knobs["enable_chunked_prefill"] == (True, False)
    assert knobs["num_gpu_blocks_override"] == (256, 512)
    with pytest.raises(ConfigError, match=r"tune\.space\.max_seqs: not a knob"):
        to_typed(compose_stage("tune", ["+tune.space.max_seqs=[8]"]), TuneStageConfig)


def test_the_tunes_pipeline_is_the_pipelines_defaults_where_it_holds_nothing(
    compose_stage,
) -> None:
    cfg = to_typed(
        compose_stage("tune", ["vidur.predictor.num_training_job_threads=1", "vidur.seed=7"]),
        TuneStageConfig,
    )
    inner = cfg.pipeline()
    defaults = PipelineStageConfig(model=cfg.model, hardware=cfg.hardware)
    for name in ("profiling", "dtype", "attn_implementation", "num_warmup_requests", "compare"):
        assert getattr(inner, name) == getattr(defaults, name)
    assert inner.goodput == defaults.goodput and inner.real_repeat == defaults.real_repeat
    assert inner.profile == TUNE_PROFILE
    predictor = VidurPredictorConfig(num_training_job_threads=1)
    assert inner.vidur == VidurConfig(predictor=predictor, seed=7)
    for name in ("model", "hardware", "workload", "backend", "profiling_root", "output"):
        assert getattr(inner, name) == getattr(cfg, name)


def test_the_capacity_steps_a_tune_runs_get_its_options(compose_stage) -> None:
    cfg = to_typed(compose_stage("tune", ["capacity.verify_seconds=9"]), TuneStageConfig)
    as_capacity = cfg.as_capacity(verify_step=1.2)
    expected = CapacityOptions(
        **{**cfg.capacity.search_fields(), **CAPACITY_ONLY, "verify_step": 1.2}
    )
    assert as_capacity.capacity == expected and as_capacity.capacity.verify_seconds == 9
    assert as_capacity.capacity.step_band == 0.0 and as_capacity.capacity.verify == "false"
    assert as_capacity.pipeline() == cfg.pipeline()


def test_the_capacity_stages_pipeline_keeps_its_settings(compose_stage) -> None:
    cfg = to_typed(
        compose_stage(
            "capacity",
            ["vidur.scheduler.watermark_blocks_fraction=0.02", "profile.max_num_tokens=512"],
        ),
        CapacityStageConfig,
    )
    inner = cfg.pipeline()
    assert inner.vidur.scheduler.watermark_blocks_fraction == 0.02
    assert inner.profile.max_num_tokens == 512
    assert dataclasses.replace(cfg, dtype="bfloat16").pipeline().dtype == "bfloat16"
