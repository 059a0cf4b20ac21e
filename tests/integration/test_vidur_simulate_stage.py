"""The vidur_simulate stage end to end on a synthetic bundle, run as a user runs it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpu_simulate_test.config.schema import ConfigError, HardwareConfig, OutputConfig
from gpu_simulate_test.config.vidur import (
    VidurConfig,
    VidurPredictorConfig,
    VidurSchedulerConfig,
    VidurSimulateStageConfig,
)
from gpu_simulate_test.core.profiling.bundle import ENGINE_STEPS_TABLE
from gpu_simulate_test.core.traffic.workloads import load_workload
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import (
    ArtifactError,
    read_csv,
    read_json,
    write_csv,
    write_json,
)
from gpu_simulate_test.io.schemas import REQUEST_METRICS
from gpu_simulate_test.vidur_simulate.metrics import ENGINE_QUEUED_DELAY, EXTRA_COLUMNS
from gpu_simulate_test.vidur_simulate.stage import run as simulate_run
from tests.conftest import run_cli
from tests.unit.calibration.test_engine_overhead import steps
from tests.vidur_bundle_factory import (
    QWEN3_0_6B,
    QWEN3_TINY,
    SyntheticRanges,
    write_synthetic_bundle,
    write_workload_run,
)

pytestmark = pytest.mark.integration

WORKLOAD = "tmp/workload/w200"
FAST = ("vidur.predictor.num_training_job_threads=1", f"workload_dir={WORKLOAD}")


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with a 200-request workload (busy enough to fill batches) and a bundle."""
    root = tmp_path_factory.mktemp("vidur_simulate")
    run_cli(
        "workload",
        "output.run_id=w200",
        "workload.num_requests=200",
        "workload.qps=100",
        "workload.prompt_len.kind=uniform",
        "workload.prompt_len.min=16",
        "workload.prompt_len.max=512",
        "workload.output_len.kind=uniform",
        "workload.output_len.min=1",
        "workload.output_len.max=48",
        "progress=false",
        cwd=root,
    )
    write_synthetic_bundle(root / "tmp" / "profiles", QWEN3_TINY, points=12)
    return root


def metrics_of(run: Path) -> pd.DataFrame:
    return read_csv(run / layout.REQUEST_METRICS, REQUEST_METRICS)


def test_replays_every_request_exactly_and_reuses_the_cache(project: Path) -> None:
    first = run_cli("vidur_simulate", *FAST, "output.run_id=a", cwd=project)
    run_cli("vidur_simulate", *FAST, "output.run_id=b", "progress=false", cwd=project)
    a, b = (project / "tmp" / "vidur_simulate" / name for name in ("a", "b"))
    assert "TTFT" in first.stdout and "tmp/vidur_simulate/a" in first.stdout

    table = metrics_of(a)
    workload = load_workload(project / WORKLOAD)
    assert list(table.columns) == [
        *REQUEST_METRICS.column_names,
        ENGINE_QUEUED_DELAY,
        *EXTRA_COLUMNS,
    ]
    assert table["request_id"].tolist() == list(range(200))
    assert table["num_prefill_tokens"].tolist() == workload.lengths["num_prefill_tokens"].tolist()
    assert table["num_decode_tokens"].tolist() == workload.lengths["num_decode_tokens"].tolist()
    assert np.array_equal(table["arrival_time_s"], workload.intervals["arrival_time_s"])
    assert (table["status"] == "ok").all()
    assert (table["ttft_s"] > 0).all() and (table["e2e_s"] >= table["ttft_s"]).all()
    one_token = table["num_decode_tokens"] == 1
    assert table.loc[one_token, "tpot_s"].isna().all()
    assert (table.loc[~one_token, "tpot_s"] > 0).all()

    meta_a, meta_b = read_json(a / layout.RUN_META), read_json(b / layout.RUN_META)
    assert meta_a["status"] == meta_b["status"] == "complete"
    assert (meta_a["predictor_cache"], meta_b["predictor_cache"]) == ("miss", "hit")
    assert meta_a["predictor_fingerprint"] == meta_b["predictor_fingerprint"]
    assert meta_a["workload_id"] == workload.workload_id
    assert meta_a["num_blocks"] == meta_a["kv_cache"]["num_blocks"] > 0
    assert meta_a["vidur_version"] == "0.0.26" and meta_a["vidur_scheduler_type"] == "sarathi"
    assert set(meta_a["timings_s"]) == {"predictor_setup", "simulation"}
    assert (a / layout.REQUEST_METRICS).read_bytes() == (b / layout.REQUEST_METRICS).read_bytes()

    raw = a / "vidur"
    assert {"config.json", "request_metrics.csv", "trace.csv"} <= {p.name for p in raw.iterdir()}
    assert not list(raw.rglob("*chrome*")) and not list(raw.rglob("*.png"))
    # Vidur's timestamped output directory was pinned away
    assert [p.name for p in a.iterdir() if p.is_dir()] == ["vidur"]
    # the lean metrics store (the default) writes no plots/ of Vidur's own store
    assert [p.name for p in raw.iterdir() if p.is_dir()] == []


def test_multirun_over_batch_size_cap_in_one_process(project: Path) -> None:
    run_cli(
        "vidur_simulate",
        "-m",
        *FAST,
        "vidur.scheduler.batch_size_cap=32,4,32",
        "output.run_id=cap",
        "progress=false",
        cwd=project,
    )
    runs = [project / "tmp" / "vidur_simulate" / f"cap-{i}" for i in range(3)]
    caps = [read_json(r / layout.RUN_META)["scheduler"]["batch_size_cap"] for r in runs]
    assert caps == [32, 4, 32]
    # the third simulation in the same process reproduces the first exactly
    assert (runs[0] / layout.REQUEST_METRICS).read_bytes() == (
        runs[2] / layout.REQUEST_METRICS
    ).read_bytes()
    # the cap reaches Vidur: 4 requests per batch schedule this workload differently
    assert not metrics_of(runs[1])["ttft_s"].equals(metrics_of(runs[0])["ttft_s"])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("vidur.predictor.num_training_job_threads=1",), "workload_dir"),
        ((*FAST, "profiling_root=nowhere"), "no profiling bundle"),
        ((*FAST, "vidur.scheduler.name=fcfs"), "vidur.scheduler.name='fcfs'"),
        ((*FAST, "vidur.scheduler.batch_size_cap=1024"), "decode batch size: needs 200"),
        (
            (*FAST, "vidur.scheduler.enable_prefix_caching=true"),
            "vidur.scheduler.enable_prefix_caching=true needs vidur.scheduler.name=vllm_v1: "
            "Vidur's sarathi scheduler does not model prefix caching",
        ),
    ],
    ids=["no-workload", "no-bundle", "bad-scheduler", "not-covered", "vidur-prefix-cache"],
)
def test_bad_input_is_one_line_and_exit_2(
    project: Path, overrides: tuple[str, ...], message: str
) -> None:
    proc = run_cli("vidur_simulate", *overrides, "output.run_id=bad", cwd=project, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    printed = " ".join(proc.stdout.split())  # rich wraps long lines at the terminal width
    assert printed.startswith("error:") and message in printed, printed
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (project / "tmp" / "vidur_simulate" / "bad").exists()


def test_qwen3_0_6b_with_batch_size_cap_128(tmp_path: Path) -> None:
    run_cli(
        "workload",
        "model=qwen3_0_6b",
        "output.run_id=w",
        "workload.num_requests=24",
        "workload.arrival.process=all_at_once",
        "workload.prompt_len.kind=fixed",
        "workload.prompt_len.value=256",
        "workload.output_len.kind=fixed",
        "workload.output_len.value=16",
        "progress=false",
        cwd=tmp_path,
    )
    ranges = SyntheticRanges(max_num_tokens=1024, max_prefill_chunk=1024, max_kv_cache_size=2048)
    write_synthetic_bundle(tmp_path / "tmp" / "profiles", QWEN3_0_6B, ranges=ranges, points=10)
    run_cli(
        "vidur_simulate",
        "model=qwen3_0_6b",
        "workload_dir=tmp/workload/w",
        "vidur.scheduler.batch_size_cap=128",
        "vidur.predictor.num_training_job_threads=1",
        "output.run_id=s",
        "progress=false",
        cwd=tmp_path,
    )
    run = tmp_path / "tmp" / "vidur_simulate" / "s"
    meta = read_json(run / layout.RUN_META)
    assert meta["vidur_model_name"] == "Qwen/Qwen3-0.6B"
    assert meta["head_dim"] == {"true": 128, "vidur_derived": 64, "patched": True}
    assert meta["kv_cache"]["kv_bytes_per_token"] == 2 * QWEN3_0_6B.kv_cache_bytes_per_token  # fp32
    assert meta["vidur_memory_bound_batch_size"] >= 128
    table = metrics_of(run)
    assert len(table) == 24 and (table["num_decode_tokens"] == 16).all()
    # all 24 arrive together and share decode batches: the last prefill waits for the others
    assert table["ttft_s"].max() > table["ttft_s"].min()


def lone_request_config(
    root: Path,
    run_id: str,
    scheduler: VidurSchedulerConfig,
    engine_overhead: str = "none",
    step_jitter: bool = False,
) -> VidurSimulateStageConfig:
    """Simulate ``root/workload/w`` with the bundle in ``root/profiles`` on a small CPU."""
    return VidurSimulateStageConfig(
        model=QWEN3_TINY,
        hardware=HardwareConfig(
            name="cpu", device="cpu", peak_bf16_tflops=1.0, memory_bandwidth_gb_s=20, memory_gib=24
        ),
        workload_dir=str(root / "workload" / "w"),
        profiling_root=str(root / "profiles"),
        vidur=VidurConfig(
            scheduler=scheduler,
            predictor=VidurPredictorConfig(
                cache_dir=str(root / "cache"), num_training_job_threads=1
            ),
            engine_overhead=engine_overhead,
            step_jitter=step_jitter,
        ),
        output=OutputConfig(root=str(root), run_id=run_id),
        progress=False,
    )


def test_fixed_orca_charges_prefill_attention(tmp_path: Path) -> None:
    """Vidur 0.0.26's Orca drops new requests' prefill attention; ours matches vllm."""
    write_workload_run(tmp_path, "w", [2000], [4], [0.0])
    write_synthetic_bundle(tmp_path / "profiles", QWEN3_TINY, points=8)

    def simulate(run_id: str, scheduler: str) -> pd.DataFrame:
        cfg = lone_request_config(tmp_path, run_id, VidurSchedulerConfig(name=scheduler))
        return metrics_of(simulate_run(cfg, {"run": run_id}))

    orca, vllm, again = simulate("orca", "orca"), simulate("vllm", "vllm"), simulate("o2", "orca")
    # a lone request: both prefill the whole prompt in one batch, attention included
    assert orca["ttft_s"].iloc[0] == pytest.approx(vllm["ttft_s"].iloc[0], rel=1e-9)
    assert orca.equals(again)  # two simulations of one config in one process agree


def test_engine_overhead_adds_the_calibrated_step_cost(tmp_path: Path) -> None:
    """A lone request: with vidur.engine_overhead, every decode step costs the calibrated
    overhead of one request more (~10.5 ms) and the prefill that plus its prompt's part."""
    write_workload_run(tmp_path, "w", [64], [9], [0.0])
    bundle = write_synthetic_bundle(tmp_path / "profiles", QWEN3_TINY, points=8)
    meta = read_json(bundle / layout.BUNDLE_META)
    write_json(bundle / layout.BUNDLE_META, {**meta, "engine_calibration": {"hf_cb": {}}})

    def simulate(run_id: str, overhead: str) -> tuple[pd.DataFrame, Path]:
        cap_one = VidurSchedulerConfig(name="sarathi", batch_size_cap=1)
        run = simulate_run(lone_request_config(tmp_path, run_id, cap_one, overhead), {})
        return metrics_of(run), run

    bare, _ = simulate("bare", "none")
    write_csv(bundle / layout.ENGINE_STEPS, steps(), ENGINE_STEPS_TABLE)
    with_overhead, run = simulate("overhead", "hf_cb")
    # the fit is against Vidur's real prediction: the recovered overhead is what the rows
    # hold beyond it, so compare the two simulations through the fitted terms
    fit = read_json(run / layout.RUN_META)["engine_overhead"]
    extra_tpot = with_overhead["tpot_s"].iloc[0] - bare["tpot_s"].iloc[0]
    one_request_ms = fit["batch_overhead_ms"][0]
    assert extra_tpot * 1e3 == pytest.approx(one_request_ms, rel=1e-6)
    extra_ttft = with_overhead["ttft_s"].iloc[0] - bare["ttft_s"].iloc[0]
    prefill_ms = one_request_ms + fit["per_prefill_request_ms"] + 64 * fit["per_prefill_token_ms"]
    assert extra_ttft * 1e3 == pytest.approx(prefill_ms, rel=1e-6)
    assert extra_tpot > 0.005  # rows say ~10 ms beyond ~1 ms of ops
    assert (run / "engine_overhead_fit.csv").is_file()
    # a backend the bundle has no calibration for: one clear error before the run exists
    with pytest.raises(ArtifactError, match="no engine calibration for backend 'hf_generate'"):
        simulate("missing", "hf_generate")
    assert not (tmp_path / "vidur_simulate" / "missing").exists()


def test_step_jitter_stretches_steps_by_the_calibrated_spread(tmp_path: Path) -> None:
    """A lone request of 33 tokens: with vidur.step_jitter each of its 32 decode steps is
    stretched by a draw from the spread (every step >= its median, the mean ratio 1.3 here)."""
    write_workload_run(tmp_path, "w", [64], [33], [0.0])
    bundle = write_synthetic_bundle(tmp_path / "profiles", QWEN3_TINY, points=8)
    meta = read_json(bundle / layout.BUNDLE_META)
    write_csv(bundle / layout.ENGINE_STEPS, steps(), ENGINE_STEPS_TABLE)
    cap_one = VidurSchedulerConfig(name="sarathi", batch_size_cap=1)

    def simulate(run_id: str, jitter: bool) -> tuple[pd.DataFrame, Path]:
        cfg = lone_request_config(tmp_path, run_id, cap_one, "hf_cb", step_jitter=jitter)
        run = simulate_run(cfg, {})
        return metrics_of(run), run

    # jitter without the engine overhead it is measured with: a config error, no run left
    no_overhead = lone_request_config(tmp_path, "bare-jitter", cap_one, "none", step_jitter=True)
    with pytest.raises(ConfigError, match=r"step_jitter=true needs vidur.engine_overhead"):
        simulate_run(no_overhead, {})
    assert not (tmp_path / "vidur_simulate" / "bare-jitter").exists()
    # a calibration without the spread (before version 4): a clear error, no run left
    write_json(bundle / layout.BUNDLE_META, {**meta, "engine_calibration": {"hf_cb": {}}})
    with pytest.raises(ArtifactError, match=r"meta.json: engine_calibration\.hf_cb\.step_jitter"):
        simulate("no-spread", True)
    assert not (tmp_path / "vidur_simulate" / "no-spread").exists()
    spread = {"percentiles": [0, 50, 100], "ratios": [1.0, 1.2, 1.8]}
    calibration = {"hf_cb": {"step_jitter": spread}}
    write_json(bundle / layout.BUNDLE_META, {**meta, "engine_calibration": calibration})
    steady, _ = simulate("steady", False)
    jittered, run = simulate("jittered", True)
    again, _ = simulate("jittered-again", True)
    ratio = jittered["tpot_s"].iloc[0] / steady["tpot_s"].iloc[0]
    assert 1.15 < ratio < 1.45  # 32 draws averaging 1.3
    assert jittered.equals(again)  # seeded by vidur.seed
    recorded = read_json(run / layout.RUN_META)["engine_overhead"]["step_jitter"]
    assert recorded["ratios"] == [1.0, 1.2, 1.8] and recorded["mean_ratio"] == pytest.approx(1.3)


def test_shared_prefixes_hit_vllm_s_prefix_cache(project: Path) -> None:
    """vllm_v1 with prefix caching on a shared-prefix workload: per request the tokens served
    from the cache (a whole number of blocks, never the whole prompt), every request after a
    prefix's first use hitting it where nothing evicts it, and the totals in run_meta.json;
    the same workload with the cache off hits nothing and takes longer to first tokens."""
    run_cli(
        "workload", "workload=shared_prefix", "output.run_id=sp", "workload.qps=50",
        "workload.prefix.len.value=128", "progress=false", cwd=project,
    )  # fmt: skip
    knobs = (
        "vidur.predictor.num_training_job_threads=1", "workload_dir=tmp/workload/sp",
        "vidur.scheduler.name=vllm_v1", "vidur.scheduler.block_size=16",
        "vidur.scheduler.chunk_size=256", "vidur.scheduler.num_blocks=4096", "progress=false",
    )  # fmt: skip
    run_cli("vidur_simulate", *knobs, "vidur.scheduler.enable_prefix_caching=true",
            "output.run_id=sp-on", cwd=project)  # fmt: skip
    run_cli("vidur_simulate", *knobs, "output.run_id=sp-off", cwd=project)
    on = project / "tmp" / "vidur_simulate" / "sp-on"
    table, off = metrics_of(on), metrics_of(project / "tmp" / "vidur_simulate" / "sp-off")
    lengths = load_workload(project / "tmp" / "workload" / "sp").lengths
    cached = table["cached_tokens"].to_numpy()
    assert (cached % 16 == 0).all() and (cached < table["num_prefill_tokens"]).all()
    first_use = ~lengths["prefix_id"].duplicated()
    assert (cached[first_use.to_numpy()] == 0).all()
    assert (cached[~first_use.to_numpy()] == 128).all()  # the whole prefix, 8 blocks
    meta = read_json(on / layout.RUN_META)["prefix_cache"]
    assert meta["hits"] == cached.sum() and meta["queries"] == table["num_prefill_tokens"].sum()
    assert 0 < meta["hit_rate"] < 1
    assert "cached_tokens" not in off.columns
    assert table["ttft_s"].median() < off["ttft_s"].median()
