"""One config class per engine: each holds only its own knobs, a knob given to another engine is
refused by name, and what a run records of its backend is its engine's knobs (old records, which
held every engine's, still read)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
from omegaconf import OmegaConf

from gpu_simulate_test.config.backends import (
    BACKEND_NAMES,
    BACKENDS,
    DEFAULT_BACKEND,
    BackendConfig,
    HfCbBackendConfig,
    HfGenerateBackendConfig,
    ServerConfig,
    VllmBackendConfig,
    backend_config,
    knob_names,
    own_knobs,
)
from gpu_simulate_test.config.capacity import CapacityStageConfig
from gpu_simulate_test.config.fidelity import FidelityStageConfig
from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.presets import preset_names
from gpu_simulate_test.config.real_bench import RealBenchStageConfig
from gpu_simulate_test.config.registry import CONFIG_DIR, to_resolved, to_typed
from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.config.tune import TuneStageConfig
from gpu_simulate_test.config.vidur import VidurProfileStageConfig

COMMON = {"name", "request_timeout_s", "gil_switch_interval_s", "warmup_shapes", "host_probe"}
BATCHING = {"max_num_batched_tokens", "max_num_seqs", "num_gpu_blocks_override", "block_size"}
HTTP = {"base_url", "served_model_name", "exact_length", "client", "server"}
VLLM_ENGINE = {
    "enable_prefix_caching",
    "enable_chunked_prefill",
    "enforce_eager",
    "kv_cache_space_gib",
    "cpu_threads_bind",
    "max_model_len",
    "gpu_memory_utilization",
}
OWN_KNOBS = {
    "hf_generate": COMMON,
    "hf_cb": COMMON | BATCHING | {"allow_block_sharing", "use_cuda_graph"},
    "openai": COMMON | BATCHING | HTTP,
    "vllm_engine": COMMON | BATCHING | VLLM_ENGINE | {"server"},
    "vllm": COMMON
    | BATCHING
    | VLLM_ENGINE
    | HTTP
    | {"engine_clock", "data_parallel_size", "servers", "router", "router_poll_s"},
}
"""Each engine's knobs, written out: a knob that lands on the wrong class fails here."""


def test_each_engine_class_holds_only_its_own_knobs() -> None:
    assert set(BACKENDS) == set(BACKEND_NAMES) == set(OWN_KNOBS)
    for name, cls in BACKENDS.items():
        assert set(knob_names(name)) == OWN_KNOBS[name], name
        assert issubclass(cls, BackendConfig) and cls().name == name


def test_the_default_engine_is_the_pipelines_vllm(compose_stage) -> None:
    assert DEFAULT_BACKEND == "vllm"
    assert isinstance(backend_config(), VllmBackendConfig)
    assert RealBenchStageConfig(workload_dir="w").backend == VllmBackendConfig()
    pipeline = to_typed(compose_stage("pipeline"), PipelineStageConfig)
    assert isinstance(pipeline.backend, VllmBackendConfig)
    assert pipeline.backend.server.kind == "vllm"


@pytest.mark.parametrize("name", BACKEND_NAMES)
def test_each_yaml_gives_its_class_defaults(compose_stage, name: str) -> None:
    """``configs/backend/<name>.yaml`` and the class agree: the YAML picks, the class holds."""
    cfg = to_typed(
        compose_stage("real_bench", [f"backend={name}", "workload_dir=w"]), RealBenchStageConfig
    )
    assert type(cfg.backend) is BACKENDS[name]
    as_yaml = OmegaConf.to_container(OmegaConf.structured(cfg.backend))
    assert as_yaml == OmegaConf.to_container(OmegaConf.structured(BACKENDS[name]()))


@pytest.mark.parametrize("name", BACKEND_NAMES)
def test_each_yaml_lists_every_knob_of_its_engine(name: str) -> None:
    """So ``--cfg job`` shows the engine's every knob (another engine's stay ``???``)."""
    listed = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "backend" / f"{name}.yaml"))
    assert isinstance(listed, dict)
    assert set(listed) == set(knob_names(name))
    assert set(listed.get("server", {})) == set(BACKENDS[name].server_knobs)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["backend=vllm", "backend.allow_block_sharing=true"],
            "backend.allow_block_sharing is an hf_cb knob; backend.name=vllm has no such knob",
        ),
        (
            ["backend=hf_generate", "backend.max_num_batched_tokens=128"],
            "backend.max_num_batched_tokens is a knob of hf_cb, openai, vllm, vllm_engine; "
            "backend.name=hf_generate has no such knob",
        ),
        (
            ["backend=hf_cb", "backend.engine_clock=false"],
            "backend.engine_clock is a vllm knob; backend.name=hf_cb has no such knob",
        ),
        (
            ["backend=openai", "backend.enforce_eager=false"],
            "backend.enforce_eager is a knob of vllm, vllm_engine; backend.name=openai",
        ),
        (
            ["backend=vllm_engine", "backend.base_url=http://h:1"],
            "backend.base_url is a knob of openai, vllm; backend.name=vllm_engine",
        ),
        (  # a server knob: by its name, for an engine without a server
            ["backend=hf_cb", "backend.server.kind=vllm"],
            "backend.server.kind is a knob of openai, vllm; backend.name=hf_cb has no such knob "
            "(to unset one a preset gives: backend.server.kind=???)",
        ),
        (
            ["backend=hf_generate", "backend.server.port=1"],
            "backend.server.port is a knob of openai, vllm; backend.name=hf_generate has no such",
        ),
        (
            ["backend=hf_cb", "backend.server.startup_timeout_s=9"],
            "backend.server.startup_timeout_s is a knob of openai, vllm, vllm_engine; "
            "backend.name=hf_cb",
        ),
        (  # vllm_engine starts no server: of its server knobs only the engine's start-up time
            ["backend=vllm_engine", "backend.server.port=1", "backend.server.nice=3"],
            "backend.server.port is a knob of openai, vllm; backend.server.nice is a knob of "
            "openai, vllm; backend.name=vllm_engine has no such knobs",
        ),
        (  # a name switched without its YAML keeps the old engine's knobs: refused, not dropped
            ["backend.name=vllm"],
            "backend.allow_block_sharing is an hf_cb knob; backend.use_cuda_graph is an hf_cb "
            "knob; backend.name=vllm has no such knobs",
        ),
    ],
)
def test_a_knob_of_another_engine_is_refused_by_name(
    compose_stage, overrides: list[str], message: str
) -> None:
    cfg = compose_stage("real_bench", ["workload_dir=w", *overrides])
    with pytest.raises(ConfigError, match="invalid config: " + re.escape(message)):
        to_typed(cfg, RealBenchStageConfig)


PRESET_STAGE = {
    "fidelity_cpu_tiny": "fidelity",
    "fidelity_cpu_tiny_vllm": "fidelity",
    "fidelity_qwen3_0_6b_h100": "fidelity",
    "fidelity_qwen3_0_6b_vllm": "fidelity",
    "qwen3_0_6b_h100": "pipeline",
    "qwen3_tiny_cpu_sweep": "pipeline",
    "capacity_cpu_tiny": "capacity",
    "capacity_qwen3_0_6b_h100": "capacity",
    "capacity_qwen3_4b_h100": "capacity",
    "capacity_qwen3_8b_h100": "capacity",
    "fidelity_qwen3_4b_h100": "fidelity",
    "fidelity_qwen3_8b_h100": "fidelity",
    "tune_qwen3_0_6b_h100": "tune",
    "tune_qwen3_4b_h100": "tune",
    "tune_qwen3_8b_h100": "tune",
}
"""Each experiment preset with a served engine (``backend``) and the stage it is written for."""
PROFILE_PRESETS = {
    "profile_cpu_tiny",
    "profile_qwen3_0_6b_h100",
    "profile_qwen3_4b_h100",
    "profile_qwen3_8b_h100",
}
"""The vidur_profile presets (their engine is the calibration's, ``engine.backend``: checked
against the real phases' in test_gpu_presets.py)."""
SCHEMAS: dict[str, type[Any]] = {
    "fidelity": FidelityStageConfig,
    "pipeline": PipelineStageConfig,
    "capacity": CapacityStageConfig,
    "tune": TuneStageConfig,
}
H100_HF_CB = {"max_num_batched_tokens": 512, "max_num_seqs": 32, "num_gpu_blocks_override": 4096}


def test_every_experiment_preset_is_listed() -> None:
    assert set(PRESET_STAGE) | PROFILE_PRESETS == set(preset_names("experiment"))


@pytest.mark.parametrize(
    ("preset", "overrides", "engine", "knobs"),
    [
        # the preset's own engine, a backend option of its own knobs
        ("qwen3_0_6b_h100", [], HfCbBackendConfig, {**H100_HF_CB, "use_cuda_graph": True}),
        ("fidelity_qwen3_0_6b_h100", [], HfCbBackendConfig, {**H100_HF_CB, "use_cuda_graph": True}),
        ("fidelity_cpu_tiny", [], HfCbBackendConfig, {"max_num_seqs": 8}),
        ("fidelity_cpu_tiny_vllm", [], VllmBackendConfig, {"max_num_batched_tokens": 256}),
        ("fidelity_qwen3_0_6b_vllm", [], VllmBackendConfig, {"max_num_batched_tokens": 512}),
        ("qwen3_tiny_cpu_sweep", [], VllmBackendConfig, {"max_num_batched_tokens": 256}),
        # backend=<engine> replaces the preset's engine and all its knobs (scripts/gpu_validate.sh
        # FIDELITY_BACKEND=hf_generate, docs/gpu.md, the presets' comments)
        ("fidelity_qwen3_0_6b_h100", ["backend=hf_generate"], HfGenerateBackendConfig, {}),
        ("fidelity_qwen3_0_6b_h100", ["backend=hf_cb_h100"], HfCbBackendConfig, H100_HF_CB),
        (
            "fidelity_qwen3_0_6b_h100",
            ["backend=hf_cb"],
            HfCbBackendConfig,
            {"num_gpu_blocks_override": 512},
        ),
        ("fidelity_cpu_tiny", ["backend=hf_generate"], HfGenerateBackendConfig, {}),
        ("fidelity_cpu_tiny", ["backend=hf_cb"], HfCbBackendConfig, {"max_num_seqs": 32}),
        ("qwen3_0_6b_h100", ["backend=hf_generate"], HfGenerateBackendConfig, {}),
        (  # README, On your own GPU: vLLM with CUDA graphs
            "qwen3_0_6b_h100",
            [
                "backend=vllm",
                "backend.enforce_eager=false",
                "backend.max_num_batched_tokens=512",
                "backend.num_gpu_blocks_override=4096",
            ],
            VllmBackendConfig,
            {
                "enforce_eager": False,
                "max_num_batched_tokens": 512,
                "num_gpu_blocks_override": 4096,
            },
        ),
        (  # README: the same fidelity campaign against vLLM on an H100
            "fidelity_qwen3_0_6b_vllm",
            ["hardware=h100", "backend.enforce_eager=false"],
            VllmBackendConfig,
            {"enforce_eager": False, "max_num_batched_tokens": 512, "max_num_seqs": 32},
        ),
        ("fidelity_qwen3_0_6b_vllm", ["backend=hf_generate"], HfGenerateBackendConfig, {}),
        # tune on your own GPU: vLLM with CUDA graphs, one server at a time on its memory share
        *[
            (
                f"tune_qwen3_{size}_h100",
                [],
                VllmBackendConfig,
                {"enforce_eager": False, "block_size": 16, "gpu_memory_utilization": 0.9},
            )
            for size in ("0_6b", "4b", "8b")
        ],
    ],
)
def test_a_preset_runs_with_every_engine_its_docs_name(
    compose_stage, preset: str, overrides: list[str], engine: type, knobs: dict
) -> None:
    stage = PRESET_STAGE[preset]
    cfg = to_typed(compose_stage(stage, [f"+experiment={preset}", *overrides]), SCHEMAS[stage])
    assert type(cfg.backend) is engine
    assert {k: getattr(cfg.backend, k) for k in knobs} == knobs


@pytest.mark.parametrize("option", preset_names("backend"))
def test_backend_on_the_command_line_replaces_a_presets_whole_engine(compose_stage, option) -> None:
    """``+experiment=<preset> backend=<option>``: exactly that option's engine and knobs, for
    every preset (none sets a backend knob outside its backend option)."""
    alone = compose_stage("real_bench", [f"backend={option}", "workload_dir=w"])
    expected = to_typed(alone, RealBenchStageConfig).backend
    for preset, stage in PRESET_STAGE.items():
        if stage == "tune" and not option.startswith("vllm"):
            continue  # the tune searches vLLM's knobs: another engine is refused by name
        cfg = compose_stage(stage, [f"+experiment={preset}", f"backend={option}"])
        assert to_typed(cfg, SCHEMAS[stage]).backend == expected, preset


@pytest.mark.parametrize(
    ("stage", "overrides", "server"),
    [
        # set over the engine's own server defaults, with or without a YAML that fills server
        (
            "vidur_profile",
            ["engine.backend.name=vllm", "engine.backend.server.startup_timeout_s=600"],
            ServerConfig(kind="vllm", startup_timeout_s=600.0),
        ),
        (
            "vidur_profile",
            ["engine.backend.name=vllm", "engine.backend.server.nice=5"],
            ServerConfig(kind="vllm", startup_timeout_s=300.0, nice=5),
        ),
        (
            "vidur_profile",
            ["engine.backend.name=vllm_engine", "engine.backend.server.startup_timeout_s=600"],
            ServerConfig(startup_timeout_s=600.0),
        ),
        (
            "vidur_profile",
            ["engine.backend.name=vllm"],
            ServerConfig(kind="vllm", startup_timeout_s=300.0),
        ),
        (
            "real_bench",
            ["backend=vllm", "backend.server.nice=5"],
            ServerConfig(kind="vllm", startup_timeout_s=300.0, nice=5),
        ),
        (
            "real_bench",
            ["backend=openai", "backend.server.kind=transformers_serve"],
            ServerConfig(kind="transformers_serve"),
        ),
        ("real_bench", ["backend=vllm_engine"], ServerConfig(startup_timeout_s=300.0)),
    ],
)
def test_a_server_knob_is_set_over_the_engines_server_defaults(
    compose_stage, stage: str, overrides: list[str], server: ServerConfig
) -> None:
    schema = VidurProfileStageConfig if stage == "vidur_profile" else RealBenchStageConfig
    typed: Any = to_typed(compose_stage(stage, ["workload_dir=w", *overrides]), schema)
    backend = typed.engine.backend if stage == "vidur_profile" else typed.backend
    assert dataclasses.replace(backend.server, extra_args=()) == server


def test_a_server_knob_for_the_calibrations_engine_is_refused_by_name(compose_stage) -> None:
    cfg = compose_stage("vidur_profile", ["engine.backend.server.kind=vllm"])
    with pytest.raises(
        ConfigError,
        match=r"engine\.backend\.server\.kind is a knob of openai, vllm; "
        r"engine\.backend\.name=hf_cb has no such knob",
    ):
        to_typed(cfg, VidurProfileStageConfig)


def test_a_vllm_engine_record_reads_back(compose_stage) -> None:
    """Its record holds every server knob at its default: not refused."""
    cfg = compose_stage("real_bench", ["workload_dir=w", "backend=vllm_engine"])
    typed = to_typed(cfg, RealBenchStageConfig)
    recorded = to_resolved(cfg, typed)
    assert set(recorded["backend"]["server"]) == {f.name for f in dataclasses.fields(ServerConfig)}
    assert to_typed(OmegaConf.create(recorded), RealBenchStageConfig).backend == typed.backend


def test_the_calibrations_engine_is_picked_by_name_with_its_defaults(compose_stage) -> None:
    typed = to_typed(compose_stage("vidur_profile"), VidurProfileStageConfig)
    assert isinstance(typed.engine.backend, HfCbBackendConfig)
    gen = compose_stage("vidur_profile", ["engine.backend.name=hf_generate"])
    assert to_typed(gen, VidurProfileStageConfig).engine.backend == HfGenerateBackendConfig()
    bad = compose_stage(
        "vidur_profile",
        ["engine.backend.name=hf_generate", "engine.backend.num_gpu_blocks_override=3"],
    )
    with pytest.raises(
        ConfigError, match=r"engine\.backend\.num_gpu_blocks_override is a knob of hf_cb"
    ):
        to_typed(bad, VidurProfileStageConfig)


def test_in_python_a_wrong_knob_or_class_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"backend\.num_gpu_blocks_override is a knob of hf_cb"):
        backend_config("hf_generate", num_gpu_blocks_override=8)
    with pytest.raises(
        ConfigError, match=r"backend\.name='vllm' takes VllmBackendConfig, not HfCbBackendConfig"
    ):
        HfCbBackendConfig(name="vllm")
    with pytest.raises(
        ConfigError, match=r"backend\.name='hf_cb' takes HfCbBackendConfig, not BackendConfig"
    ):
        BackendConfig(name="hf_cb")
    built = backend_config(
        "vllm", max_num_batched_tokens=64, server={"kind": "external", "port": 9}
    )
    assert isinstance(built, VllmBackendConfig)
    assert built.server == ServerConfig(kind="external", port=9, startup_timeout_s=300.0)
    with pytest.raises(ConfigError, match=r"backend\.server\.port is a knob of openai, vllm; "):
        backend_config("vllm_engine", server={"port": 9})


def test_step_limits_are_the_engines_own_or_the_batching_defaults() -> None:
    assert HfCbBackendConfig(max_num_batched_tokens=96, max_num_seqs=5).step_limits() == (96, 5)
    assert HfGenerateBackendConfig().step_limits() == HfCbBackendConfig().step_limits()


def test_a_run_records_its_engines_knobs_only(compose_stage) -> None:
    cfg = compose_stage(
        "real_bench", ["workload_dir=w", "backend=openai", "backend.client=asyncio"]
    )
    typed = to_typed(cfg, RealBenchStageConfig)
    recorded = to_resolved(cfg, typed)["backend"]
    assert set(recorded) == OWN_KNOBS["openai"]
    assert recorded["client"] == "asyncio" and recorded["max_num_batched_tokens"] == 256
    assert "???" not in str(recorded)
    # and reads back as the same engine
    again = to_typed(OmegaConf.create({**to_resolved(cfg, typed)}), RealBenchStageConfig)
    assert again.backend == typed.backend
    assert to_typed(OmegaConf.structured(typed), RealBenchStageConfig) == typed


def test_a_record_of_every_engines_knobs_still_reads(compose_stage, tmp_path) -> None:
    """A pipeline config recorded before one class per engine held all 23 knobs."""
    from gpu_simulate_test.orchestrate.configs import as_resolved, recorded_pipeline
    from gpu_simulate_test.orchestrate.profiling import engine_identity

    typed = to_typed(compose_stage("pipeline"), PipelineStageConfig)
    recorded = as_resolved(typed)
    old = {**recorded["backend"], "allow_block_sharing": False, "use_cuda_graph": None}
    assert set(own_knobs(old)) == OWN_KNOBS["vllm"]
    again = recorded_pipeline({**recorded, "backend": old}, tmp_path / "manifest.json")
    assert again.backend == typed.backend
    assert engine_identity(old) == engine_identity(recorded["backend"])


@pytest.mark.parametrize("size", ["0_6b", "4b", "8b"])
def test_a_gpu_tune_checks_one_server_at_a_time(compose_stage, size: str) -> None:
    cfg = to_typed(compose_stage("tune", [f"+experiment=tune_qwen3_{size}_h100"]), TuneStageConfig)
    assert cfg.tune.servers_at_once == 1 and cfg.tune.verify == "top_k"
    assert cfg.hardware.device.startswith("cuda")  # dtype auto: bf16 on CUDA
    assert cfg.model.name == f"qwen3_{size}"
    # the preset's lengths, not the tune's CPU defaults (a stage's own come after a group's)
    assert (cfg.workload.prompt_len.min, cfg.workload.prompt_len.max) == (32, 512)
    assert isinstance(cfg.backend, VllmBackendConfig)
    assert cfg.backend.num_gpu_blocks_override == 16384
    assert max(cfg.tune.space["max_num_batched_tokens"]) == 8192
