"""The vidur_profile stage end to end, run as a user runs it (``python -m ...cli.vidur_profile``).

One multirun (two bundles, tiny ranges, widened by a workload) is shared by the tests below.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from gpu_simulate_test.cli.registry import CONFIG_DIR, register_configs
from gpu_simulate_test.config.registry import to_typed
from gpu_simulate_test.config.schema import ModelConfig, WorkloadStageConfig
from gpu_simulate_test.core.profiling.bundle import (
    META_REQUIRED_KEYS,
    MLP_OPS,
    BundleRanges,
    load_bundle,
)
from gpu_simulate_test.core.traffic.workloads import load_workload
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import read_json
from gpu_simulate_test.io.runs import open_upstream_run
from gpu_simulate_test.vidur_profile.profile_checks import profile_warnings
from gpu_simulate_test.workload.stage import run as build_workload
from tests.conftest import run_cli

pytestmark = pytest.mark.integration

TINY_RANGES = (
    "profile.max_num_tokens=32",
    "profile.max_batch_size=3",
    "profile.max_prefill_chunk=32",
    "profile.max_kv_cache_size=64",
    "profile.num_points=4",
    "profiling.warmup_iters=1",
    "profiling.repeat_iters=2",
)
PROMPT_TOKENS, OUTPUT_TOKENS = 40, 50
"""The workload's every request: wider than the ranges above, so it must widen them."""


@dataclass(frozen=True)
class Profiled:
    root: Path
    workload_id: str
    stdout: str


def _tiny_model() -> ModelConfig:
    loaded = OmegaConf.load(CONFIG_DIR / "model" / "qwen3_tiny.yaml")
    assert isinstance(loaded, DictConfig)
    return to_typed(loaded, ModelConfig)


def _build_workload(root: Path) -> str:
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(
            config_name="workload",
            overrides=[
                f"output.root={root / 'tmp'}",
                "output.run_id=wl",
                "workload.num_requests=4",
                "workload.prompt_len.kind=fixed",
                f"workload.prompt_len.value={PROMPT_TOKENS}",
                "workload.output_len.kind=fixed",
                f"workload.output_len.value={OUTPUT_TOKENS}",
                "progress=false",
            ],
        )
    GlobalHydra.instance().clear()
    build_workload(to_typed(cfg, WorkloadStageConfig), {})
    return load_workload(root / "tmp" / "workload" / "wl").workload_id


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> Profiled:
    root = tmp_path_factory.mktemp("vidur_profile")
    workload_id = _build_workload(root)
    proc = run_cli(
        "vidur_profile",
        "-m",
        "model=qwen3_tiny",
        "hardware=cpu",
        "profiling_root=pa,pb",
        "output.run_id=m",
        "workload_dir=tmp/workload/wl",
        *TINY_RANGES,
        cwd=root,
        subprocess_=True,  # a multirun of the profiler, for the slow tests only
    )
    return Profiled(root, workload_id, proc.stdout)


@pytest.mark.slow  # profiles a model twice (the module fixture)
@pytest.mark.parametrize("job", [0, 1])
def test_multirun_writes_one_valid_bundle_and_run_per_job(profiled: Profiled, job: int) -> None:
    bundle_path = profiled.root / ("pa", "pb")[job] / "cpu" / "qwen3_tiny"
    bundle = load_bundle(bundle_path, _tiny_model())
    # widened by the workload: prompt 40 tokens, longest context 40 + 50
    total = PROMPT_TOKENS + OUTPUT_TOKENS
    assert bundle.ranges == BundleRanges(PROMPT_TOKENS, 3, PROMPT_TOKENS, total, 16)

    mlp = bundle.mlp
    assert sorted(mlp["num_tokens"])[:8] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert mlp["num_tokens"].max() == PROMPT_TOKENS
    assert (mlp.filter(like="time_stats.").to_numpy() >= 0).all()
    assert (mlp.filter(like=".median").to_numpy() > 0).all()

    attention = bundle.attention
    decode = attention[attention["prefill_chunk_size"] == 0]
    prefill = attention[attention["prefill_chunk_size"] > 0]
    assert set(decode["batch_size"]) == {1, 2, 3}
    assert {0, 1, 16, 64, total} <= set(decode["kv_cache_size"])
    assert set(prefill["kv_cache_size"]) == set(decode["kv_cache_size"])
    assert prefill["prefill_chunk_size"].max() == PROMPT_TOKENS and set(prefill["batch_size"]) == {
        1
    }
    assert (decode["time_stats.attn_decode.median"] > 0).all()
    assert (prefill["time_stats.attn_prefill.median"] > 0).all()
    assert (attention["time_stats.attn.median"] > 0).all()
    assert (attention["time_stats.attn_kv_cache_save.median"] > 0).all()

    meta = bundle.meta
    assert set(META_REQUIRED_KEYS) <= set(meta)
    assert meta["hardware"] == "cpu" and meta["dtype"] == "float32"
    assert meta["timing_method"] == "perf_counter_ns" and meta["attn_implementation"] == "sdpa"
    assert meta["warmup_iters"] == 1 and meta["repeat_iters"] == 2
    assert "q_norm" in meta["op_definitions"]["attn_rope"] and "attn_rope" in meta["notes"][0]
    assert meta["workload"]["workload_id"] == profiled.workload_id
    assert meta["profile_wall_time_s"] > 0 and "driver" in meta and meta["transformers_version"]

    run = profiled.root / "tmp" / "vidur_profile" / f"m-{job}"
    run_meta = open_upstream_run(run, "vidur_profile")
    assert (profiled.root / run_meta["bundle_dir"]).resolve() == bundle_path.resolve()
    assert run_meta["num_attention_rows"] == len(attention)
    # the disturbed-profile check is the bundle's own: whatever this machine's load was
    assert meta["quality_warnings"] == profile_warnings(mlp, attention, MLP_OPS)
    assert run_meta["quality_warnings"] == len(meta["quality_warnings"])
    assert [p.name for p in bundle_path.parent.iterdir()] == ["qwen3_tiny"]  # no staging dirs
    assert str(Path("cpu") / "qwen3_tiny") in profiled.stdout


@pytest.mark.slow  # profiles a model twice (the module fixture)
def test_a_used_run_id_or_an_existing_bundle_is_refused(profiled: Profiled) -> None:
    root = profiled.root
    same_id = run_cli(
        "vidur_profile",
        "output.run_id=m-0",
        "profiling_root=pc",
        *TINY_RANGES,
        cwd=root,
        check=False,
    )
    assert same_id.returncode == 2
    assert "already exists" in same_id.stdout and "Traceback" not in same_id.stderr
    assert not (root / "pc").exists()

    meta_before = read_json(root / "pa" / "cpu" / "qwen3_tiny" / layout.BUNDLE_META)
    same_bundle = run_cli(
        "vidur_profile",
        "output.run_id=new",
        "profiling_root=pa",
        *TINY_RANGES,
        cwd=root,
        check=False,
    )
    assert same_bundle.returncode == 2
    assert "already holds a profiling bundle" in same_bundle.stdout
    assert "output.overwrite=true" in same_bundle.stdout
    assert read_json(root / "pa" / "cpu" / "qwen3_tiny" / layout.BUNDLE_META) == meta_before
    assert not (root / "tmp" / "vidur_profile" / "new").exists()


@pytest.mark.slow  # drives two real engines
def test_engine_calibration_times_real_steps_and_keeps_other_backends(tmp_path: Path) -> None:
    """hf_cb then hf_generate into one bundle: both calibrations are there, each step costs
    more than the decoder layers' profiled ops (the LM head over 151,936 tokens alone does)."""
    calibrate = (
        "engine.enable=true",
        "engine.prompt_lengths=[16,32]",
        "engine.decode_tokens=8",
        "engine.repeats=1",
    )
    common = ("model=qwen3_tiny", "hardware=cpu", "profiling_root=p", *TINY_RANGES, *calibrate)
    run_cli(
        "vidur_profile",
        *common,
        "output.run_id=cb",
        "engine.batch_sizes=[1,3]",
        cwd=tmp_path,
    )
    proc = run_cli(
        "vidur_profile",
        *common,
        "output.run_id=gen",
        "output.overwrite=true",
        "engine.backend.name=hf_generate",
        cwd=tmp_path,
    )
    assert "engine hf_generate decode step" in proc.stdout
    bundle = load_bundle(tmp_path / "p" / "cpu" / "qwen3_tiny", _tiny_model())
    cb, gen = bundle.engine_steps("hf_cb"), bundle.engine_steps("hf_generate")
    assert sorted(cb["batch_size"][cb["phase"] == "decode"]) == [1, 3]
    assert list(gen["batch_size"][gen["phase"] == "decode"]) == [1]  # one request at a time
    assert sorted(gen["num_q_tokens"][gen["phase"] == "prefill"]) == [16, 32]
    assert (cb["samples"] >= 1).all() and (cb["context_tokens"] >= cb["num_q_tokens"]).all()
    assert set(bundle.meta["engine_calibration"]) == {"hf_cb", "hf_generate"}
    assert bundle.meta["engine_calibration"]["hf_cb"]["backend"]["name"] == "hf_cb"
    spread = bundle.meta["engine_calibration"]["hf_generate"]["step_jitter"]
    assert spread["samples"] == gen["samples"][gen["phase"] == "decode"].iloc[0]
    at = dict(zip(spread["percentiles"], spread["ratios"], strict=True))
    assert at[50] == pytest.approx(1.0)  # each step relative to its row's median
    assert spread["rows"] == 1
    one = bundle.mlp[bundle.mlp["num_tokens"] == 1].filter(like=".median").sum(axis=1).iloc[0]
    layers_ms = one * bundle.meta["model"]["num_layers"]
    assert (gen["step_ms"] > layers_ms).all() and (cb["step_ms"] > layers_ms).all()
    # the host's memory speed, read before the experiments and after the replays: one LM head
    # of tiny Qwen3 in float32 (78 MB), as every real run reads it around its replay
    for name in ("hf_cb", "hf_generate"):
        probe = bundle.meta["engine_calibration"][name]["host_probe"]
        assert probe["mbytes"] == pytest.approx(151936 * 128 * 4 / 1e6, rel=1e-3), name
        mean = (probe["before"]["ms"] + probe["after"]["ms"]) / 2
        assert probe["ms"] == pytest.approx(mean, rel=1e-3) and probe["before"]["reads"] >= 1
