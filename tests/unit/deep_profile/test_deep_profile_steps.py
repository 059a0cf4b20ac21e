"""deep_profile steps: order and toggles, failure isolation, nsys/ncu skip reasons and argv."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from hydra.errors import ConfigCompositionException

from gpu_simulate_test.config.deep_profile import (
    DeepProfilePipeline,
    DeepProfileStageConfig,
    NsysStep,
    StaticAnalysisStep,
    TorchProfilerStep,
)
from gpu_simulate_test.config.presets import hardware_preset, model_preset
from gpu_simulate_test.config.registry import to_typed
from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.core.engines.records import BenchRequest
from gpu_simulate_test.deep_profile import contract as files
from gpu_simulate_test.deep_profile import steps
from gpu_simulate_test.deep_profile.inputs import ProfileInputs
from gpu_simulate_test.deep_profile.nsight.tools import StepOutcome
from gpu_simulate_test.deep_profile.nsight_steps import (
    ncu_argv,
    nsys_argv,
    preflight,
    run_ncu,
    run_nsys,
)
from gpu_simulate_test.deep_profile.static import lengths_of
from gpu_simulate_test.io.artifacts import read_json
from tests.conftest import SHARED_FIXTURES


def _cfg(**pipeline: Any) -> DeepProfileStageConfig:
    return DeepProfileStageConfig(
        model=model_preset("qwen3_tiny"),
        hardware=hardware_preset("h100"),
        pipeline=replace(DeepProfilePipeline(), **pipeline),
    )


def _ctx(tmp_path: Path, cfg: DeepProfileStageConfig, **kw: Any) -> steps.StepContext:
    req = BenchRequest(0, 8, 4, 0.0, tuple(range(8)))
    return steps.StepContext(cfg, tmp_path, ProfileInputs((req,), {"kind": "test"}), **kw)


def test_every_step_is_registered_in_order_and_toggles_drop_steps() -> None:
    assert set(steps.STEPS) == set(steps.STEP_ORDER)
    assert steps.STEP_ORDER.index("static_analysis") < steps.STEP_ORDER.index("torch_profiler")
    assert steps.STEP_ORDER.index("torch_profiler") < steps.STEP_ORDER.index("nsys")
    assert steps.STEP_ORDER.index("nsys") < steps.STEP_ORDER.index("ncu")
    assert steps.enabled_steps(DeepProfilePipeline()) == [
        "static_analysis",
        "torch_profiler",
        "nsys",
        "ncu",
    ]
    off = _cfg(torch_profiler=TorchProfilerStep(enable=False), nsys=NsysStep(enable=False))
    assert steps.enabled_steps(off.pipeline) == ["static_analysis", "ncu"]


def test_a_failing_step_is_recorded_and_later_steps_still_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[str] = []

    def boom(ctx: steps.StepContext) -> StepOutcome:
        ran.append("static_analysis")
        raise RuntimeError("bad shape")

    def fine(name: str) -> Any:
        def step(ctx: steps.StepContext) -> StepOutcome:
            ran.append(name)
            return StepOutcome.ok(name)

        return step

    fake = {name: fine(name) for name in steps.STEP_ORDER}
    fake["static_analysis"] = boom
    monkeypatch.setattr(steps, "STEPS", fake)
    outcomes = steps.run_steps(_ctx(tmp_path, _cfg()))
    assert ran == ["static_analysis", "torch_profiler", "nsys", "ncu"]
    assert outcomes[0].status == "failed" and "RuntimeError: bad shape" in outcomes[0].reason
    assert (tmp_path / "static_analysis_error.txt").is_file()
    assert [o.status for o in outcomes[1:]] == ["ok", "ok", "ok"]


def test_preflight_names_every_missing_piece() -> None:
    gate = preflight("nsys", "nsys", None, "cpu", cuda_available=False)
    assert gate.status == "skipped"
    assert "nsys not found" in gate.reason and "hardware.device=cpu" in gate.reason
    gate = preflight("ncu", "ncu", "/opt/ncu", "cuda", cuda_available=False)
    assert gate.reason == "no CUDA GPU visible (torch.cuda.is_available() is False)"
    assert preflight("ncu", "ncu", "/opt/ncu", "cuda:0", cuda_available=True).status == "ok"


def test_nsight_steps_skip_with_reason_and_still_write_the_command(tmp_path: Path) -> None:
    cfg = _cfg()
    ctx = _ctx(tmp_path, cfg, tool_finder=lambda _n: None, cuda_check=lambda: False)
    outcomes = {o.step: o for o in (steps.STEPS["nsys"](ctx), steps.STEPS["ncu"](ctx))}
    assert outcomes["nsys"].status == outcomes["ncu"].status == "skipped"
    assert "nsys not found" in outcomes["nsys"].reason
    assert "no CUDA GPU visible" in outcomes["ncu"].reason
    command = yaml.safe_load((tmp_path / files.NSYS_DIR / files.COMMAND).read_text())
    assert command["status"] == "skipped" and command["argv"][:2] == ["nsys", "profile"]


def test_model_steps_skip_with_reason_on_a_gpu_hardware_without_a_gpu(tmp_path: Path) -> None:
    """hardware=h100 where torch sees no GPU: skipped, saying why, not an AssertionError."""
    ctx = _ctx(tmp_path, _cfg(), cuda_check=lambda: False)
    for step in ("torch_profiler", "run_workload"):
        outcome = steps.STEPS[step](ctx)
        assert (outcome.step, outcome.status) == (step, "skipped")
        assert "hardware=h100 runs on cuda" in outcome.reason
        assert "torch.cuda.is_available() is False" in outcome.reason
    assert ctx._model is None  # nothing was built


def test_nsys_argv_profiles_the_stage_with_only_run_workload(tmp_path: Path) -> None:
    argv = nsys_argv(_cfg(), tmp_path, tmp_path / "nsys", "/usr/bin/nsys")
    assert argv[:2] == ["/usr/bin/nsys", "profile"]
    assert "--capture-range=nvtx" in argv
    assert "--nvtx-capture=deep_profile_workload" in argv
    app = argv[argv.index("-m") - 1 :]
    assert app[2] == "gpu_simulate_test.cli.deep_profile"
    assert f"--config-path={tmp_path.resolve()}" in app
    assert "pipeline.run_workload.enable=true" in app
    for step in ("static_analysis", "torch_profiler", "nsys", "ncu"):
        assert f"pipeline.{step}.enable=false" in app
    whole = nsys_argv(_cfg(nsys=NsysStep(capture_range="none")), tmp_path, tmp_path)
    assert not any(a.startswith("--capture-range") for a in whole)


def test_ncu_argv_filters_on_the_nvtx_range_and_top_kernels(tmp_path: Path) -> None:
    argv = ncu_argv(_cfg(), tmp_path, tmp_path / "ncu", "ncu", ["gemv<float>", "k2"])
    i = argv.index("--nvtx-include")
    assert argv[i - 1] == "--nvtx" and argv[i + 1] == "decode/"
    # nsys reports demangled names; ncu matches its bare function name unless told otherwise
    assert argv[argv.index("--kernel-name-base") + 1] == "demangled"
    assert argv[argv.index("--kernel-name") + 1] == r"regex:^gemv<float>(\(.*\))?$|^k2(\(.*\))?$"
    assert argv[argv.index("--launch-count") + 1] == "50"
    assert "SpeedOfLight" in argv  # kernel_overview preset sections
    unfiltered = ncu_argv(_cfg(), tmp_path, tmp_path)
    assert "--kernel-name" not in unfiltered and "--kernel-name-base" not in unfiltered


def test_nsys_then_ncu_with_a_fake_profiler(tmp_path: Path) -> None:
    """The GPU path end to end with recorded outputs: stats parsed, top kernels fed to ncu."""
    kern_sum = SHARED_FIXTURES / "nsys" / "cuda_gpu_kern_sum.csv"
    ncu_csvs = sorted((SHARED_FIXTURES / "ncu").glob("kernel_*/ncu.section_SpeedOfLight.csv"))
    assert kern_sum.is_file() and ncu_csvs, "tests/data/fixtures is incomplete"
    calls: list[list[str]] = []

    def runner(argv: list[str], **_kw: Any) -> subprocess.CompletedProcess:
        calls.append(argv)
        stdout = ""
        if argv[1] == "stats":
            shutil.copy(kern_sum, Path(argv[argv.index("--output") + 1] + "_cuda_gpu_kern_sum.csv"))
        if "--import" in argv:
            stdout = ncu_csvs[0].read_text()
        elif "--export" in argv:  # ncu writes <export>.ncu-rep
            Path(argv[argv.index("--export") + 1] + ".ncu-rep").write_bytes(b"report")
        return subprocess.CompletedProcess(argv, 0, stdout, "")

    cfg = _cfg()
    ok = StepOutcome.ok
    outcome, summary = run_nsys(cfg, tmp_path, "/x/nsys", ok("nsys"), runner=runner)
    assert outcome.status == "ok", outcome.reason
    assert len(summary["top_kernels"]) == 5
    assert (tmp_path / files.NSYS_DIR / "top_kernels.yaml").is_file()
    kernels = read_json(tmp_path / files.NSYS_DIR / files.NSYS_KERNELS_JSON)["kernels"]
    assert len(kernels) == summary["num_kernels"] > len(summary["top_kernels"])
    outcome, summary = run_ncu(cfg, tmp_path, "/x/ncu", ok("ncu"), runner=runner)
    assert outcome.status == "ok", outcome.reason
    # SpeedOfLight of this kernel: 9.15 % compute vs 19.66 % memory, both under 60 % → latency
    assert summary["kernel_bounds"][0]["bound"] == "latency-bound"
    bounds = read_json(tmp_path / files.NCU_DIR / files.NCU_BOUNDS_JSON)
    assert bounds == {"kernels": summary["kernel_bounds"]}
    ncu_call = calls[2]
    assert ncu_call[0] == "/x/ncu" and "--kernel-name" in ncu_call


def test_nsys_crashing_after_its_report_is_still_read(tmp_path: Path) -> None:
    """nsys 2025.3 on the lent H100: "Generated: profile.nsys-rep", then exit 139 (SIGSEGV)."""
    kern_sum = SHARED_FIXTURES / "nsys" / "cuda_gpu_kern_sum.csv"

    def runner(argv: list[str], write_report: bool) -> subprocess.CompletedProcess:
        if argv[1] == "stats":
            shutil.copy(kern_sum, Path(argv[argv.index("--output") + 1] + "_cuda_gpu_kern_sum.csv"))
            return subprocess.CompletedProcess(argv, 0, "", "")
        if write_report:
            report = next(a.split("=", 1)[1] for a in argv if a.startswith("--output="))
            Path(report + ".nsys-rep").write_bytes(b"report")
        return subprocess.CompletedProcess(argv, 139, "Generated:\n", "")

    ok = StepOutcome.ok("nsys")
    outcome, summary = run_nsys(
        _cfg(), tmp_path, "/x/nsys", ok, runner=lambda argv, **_: runner(argv, True)
    )
    assert outcome.status == "ok" and "exited with 139" in summary["profile_exit"]
    assert len(summary["top_kernels"]) == 5
    # the report of that run is not taken for a later run's that wrote none
    outcome, _ = run_nsys(
        _cfg(), tmp_path, "/x/nsys", ok, runner=lambda argv, **_: runner(argv, False)
    )
    assert outcome.status == "failed" and "exited with 139" in outcome.reason


def test_a_profiler_error_fails_the_step_with_its_output(tmp_path: Path) -> None:
    def runner(argv: list[str], **_kw: Any) -> subprocess.CompletedProcess:
        return subprocess.CompletedProcess(argv, 1, "", "ERR_NVGPUCTRPERM")

    outcome, _ = run_ncu(_cfg(), tmp_path, "/x/ncu", StepOutcome.ok("ncu"), runner=runner)
    assert outcome.status == "failed" and "ERR_NVGPUCTRPERM" in outcome.reason


def test_ncu_that_profiled_no_kernel_fails_the_step_saying_so(tmp_path: Path) -> None:
    """ncu exits 0 with "==WARNING== No kernels were profiled." and writes no report when the
    NVTX range or the kernel filter matches nothing; the step said only "ncu --import exited
    with 1" (and took an earlier try's report for this one's)."""
    imports: list[list[str]] = []

    def runner(argv: list[str], **_kw: Any) -> subprocess.CompletedProcess:
        if "--import" in argv:
            imports.append(argv)
            return subprocess.CompletedProcess(argv, 1, "", "==ERROR== cannot open the file")
        return subprocess.CompletedProcess(argv, 0, "==WARNING== No kernels were profiled.", "")

    stale = tmp_path / files.NCU_DIR / f"{files.NCU_REPORT_STEM}.ncu-rep"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"an earlier try's report")
    outcome, _ = run_ncu(_cfg(), tmp_path, "/x/ncu", StepOutcome.ok("ncu"), runner=runner)
    assert outcome.status == "failed" and not imports
    assert "profiled no kernel" in outcome.reason and "NVTX range decode/" in outcome.reason
    assert "No kernels were profiled" in (tmp_path / files.NCU_DIR / files.LOG).read_text()

    def import_fails(argv: list[str], **_kw: Any) -> subprocess.CompletedProcess:
        if "--export" in argv:
            Path(argv[argv.index("--export") + 1] + ".ncu-rep").write_bytes(b"report")
        return runner(argv)

    outcome, _ = run_ncu(_cfg(), tmp_path, "/x/ncu", StepOutcome.ok("ncu"), runner=import_fails)
    assert outcome.status == "failed" and "cannot open the file" in outcome.reason


def test_lengths_default_to_the_requests() -> None:
    reqs = [BenchRequest(0, 64, 16, 0.0), BenchRequest(1, 32, 1, 0.0)]
    assert lengths_of(reqs) == ((32, 64), (64, 78))
    assert lengths_of(reqs, (8,), (100,)) == ((8,), (100,))


def test_bad_pipeline_values_fail_naming_the_field(compose_stage: Any) -> None:
    with pytest.raises(ConfigError, match="activities"):
        TorchProfilerStep(activities=("cpu", "tpu"))
    with pytest.raises(ConfigError, match="capture_range"):
        NsysStep(capture_range="cudaProfilerApi")
    with pytest.raises(ConfigError, match="batch_sizes"):
        StaticAnalysisStep(batch_sizes=(0,))
    with pytest.raises(ConfigCompositionException, match="enabel"):
        compose_stage("deep_profile", ["pipeline.nsys.enabel=false"])
    with pytest.raises(ConfigCompositionException, match="top_k"):
        compose_stage("deep_profile", ["pipeline.nsys.top_k=many"])
    cfg = to_typed(compose_stage("deep_profile", ["hardware=h100"]), DeepProfileStageConfig)
    assert isinstance(cfg, DeepProfileStageConfig) and cfg.hardware.device == "cuda"


def test_stakeholder_summary_says_why_the_timed_run_is_missing() -> None:
    from gpu_simulate_test.deep_profile.report import stakeholder_summary

    skipped = StepOutcome.skipped("torch_profiler", "no GPU visible to torch")
    text = stakeholder_summary("t", [StepOutcome.ok("static_analysis"), skipped], None, "h100")
    assert "did not complete" in text and "no GPU visible to torch" in text
    disabled = stakeholder_summary("t", [StepOutcome.ok("static_analysis")], None, "h100")
    assert "was not part of this profile" in disabled


def test_torch_profiler_shows_a_bar_per_pass_over_the_requests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The warm-up, timed and profiled passes serve every request (minutes for a real model on
    a CPU): each has its bar, advanced once per request served."""
    from gpu_simulate_test.core.model.modeling import build_model
    from gpu_simulate_test.deep_profile.torch_prof import run_torch_profiler

    cfg = replace(
        _cfg(torch_profiler=TorchProfilerStep(chrome_trace=False, num_warmup_requests=1)),
        hardware=hardware_preset("cpu"),
    )
    reqs = tuple(BenchRequest(i, 8, 2, 0.0, tuple(range(8))) for i in range(3))
    model = build_model(cfg.model, "cpu", cfg.dtype, cfg.attn_implementation)
    capsys.readouterr()
    run_torch_profiler(cfg, model, ProfileInputs(reqs, {"kind": "test"}), tmp_path)
    out = capsys.readouterr().out
    for label, count in (("warm-up", "1/1"), ("timed pass", "3/3"), ("profiled pass", "3/3")):
        line = next(x for x in out.splitlines() if f"torch_profiler {label}" in x)
        assert count in line, line
    quiet = replace(cfg, progress=False)
    run_torch_profiler(quiet, model, ProfileInputs(reqs, {"kind": "test"}), tmp_path / "q")
    assert "torch_profiler" not in capsys.readouterr().out


def test_more_requests_than_the_workload_holds_are_refused_not_cut(tmp_path: Path) -> None:
    """``num_requests=8`` of the 4-request synthetic workload profiled 4, said nowhere but in
    ``inputs.yaml``; it is refused naming both numbers and the way out."""
    from gpu_simulate_test.deep_profile.inputs import load_inputs

    cfg = replace(_cfg(), hardware=hardware_preset("cpu"), num_requests=8)
    with pytest.raises(ConfigError, match=r"num_requests=8: the synthetic workload holds 4 "):
        load_inputs(cfg)
    wider = replace(cfg, workload=replace(cfg.workload, num_requests=8))
    assert len(load_inputs(wider).requests) == 8
    assert len(load_inputs(replace(cfg, num_requests=3)).requests) == 3
