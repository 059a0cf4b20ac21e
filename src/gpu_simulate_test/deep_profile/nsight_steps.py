"""The nsys and ncu steps: profile the workload app (this stage, only ``run_workload`` on).

Each step always writes ``command.json`` (the argv that runs, or would run) and runs the
profiler only when the tool is installed and the run is on a visible CUDA GPU; otherwise it is
``skipped`` with the reason. Profilers run through ``subprocess`` with an argv list (no shell).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpu_simulate_test.config.deep_profile import DeepProfileStageConfig
from gpu_simulate_test.deep_profile import contract as files
from gpu_simulate_test.deep_profile.nsight.classify import classify_bound
from gpu_simulate_test.deep_profile.nsight.commands import (
    NSYS_STATS_REPORTS,
    ncu_import_csv_argv,
    ncu_profile_argv,
    nsys_profile_argv,
    nsys_stats_argv,
    nsys_stats_outputs,
)
from gpu_simulate_test.deep_profile.nsight.parsers import parse_kernel_summary, parse_ncu_csv
from gpu_simulate_test.deep_profile.nsight.tools import StepOutcome
from gpu_simulate_test.deep_profile.nsight.top_kernels import (
    KERNEL_NAME_BASE,
    TOP_KERNELS_FILE,
    extract_top_kernels,
    kernel_name_regex,
    write_top_kernels_yaml,
)
from gpu_simulate_test.io.artifacts import atomic_open, write_json

Runner = Callable[..., subprocess.CompletedProcess]
"""``subprocess.run``'s signature; tests pass a fake."""

APP_MODULE = "gpu_simulate_test.cli.deep_profile"
APP_RUN_ID = "app"
LOG_TAIL_CHARS = 2000


def gpu_skip_reason(device: str, cuda_available: bool) -> str | None:
    """Why Nsight cannot profile this run's kernels, or None when it can."""
    if not device.startswith("cuda"):
        return f"hardware.device={device}: Nsight profiles CUDA kernels (use a GPU hardware)"
    if not cuda_available:
        return "no CUDA GPU visible (torch.cuda.is_available() is False)"
    return None


def preflight(
    step: str, tool: str, tool_path: str | None, device: str, cuda_available: bool
) -> StepOutcome:
    """``ok``, or ``skipped`` naming every missing piece (the tool, the GPU)."""
    reasons = []
    if tool_path is None:
        reasons.append(f"{tool} not found on PATH or in CUDA directories")
    gpu = gpu_skip_reason(device, cuda_available)
    if gpu is not None:
        reasons.append(gpu)
    return StepOutcome.skipped(step, "; ".join(reasons)) if reasons else StepOutcome.ok(step)


def workload_app_argv(run_dir: Path, app_root: Path, python: str = sys.executable) -> list[str]:
    """This stage re-invoked from the run's ``config.yaml`` with only ``run_workload`` on."""
    return [
        python,
        "-m",
        APP_MODULE,
        f"--config-path={run_dir.resolve()}",
        f"--config-name={Path(files.CONFIG).stem}",
        "pipeline.static_analysis.enable=false",
        "pipeline.torch_profiler.enable=false",
        "pipeline.nsys.enable=false",
        "pipeline.ncu.enable=false",
        "pipeline.run_workload.enable=true",
        f"output.root={app_root.resolve()}",
        f"output.run_id={APP_RUN_ID}",
        "output.overwrite=true",
        "progress=false",
        "hydra.run.dir=.",
        "hydra.output_subdir=null",
        "hydra/job_logging=stdout",  # no <job>.log in the working directory
    ]


def nsys_argv(
    cfg: DeepProfileStageConfig, run_dir: Path, out: Path, nsys: str = "nsys"
) -> list[str]:
    """``nsys profile`` of the workload app, gated on its NVTX range unless capture_range=none."""
    opts = cfg.pipeline.nsys
    by_range = opts.capture_range == "nvtx"
    return nsys_profile_argv(
        workload_app_argv(run_dir, out / "app"),
        out / files.NSYS_REPORT_STEM,
        nsys=nsys,
        trace=opts.trace,
        capture_range="nvtx" if by_range else "none",
        nvtx_capture=cfg.pipeline.run_workload.nvtx_range if by_range else None,
    )


def ncu_argv(
    cfg: DeepProfileStageConfig,
    run_dir: Path,
    out: Path,
    ncu: str = "ncu",
    kernel_names: Sequence[str] = (),
) -> list[str]:
    """``ncu`` of the workload app: kernels inside ``pipeline.ncu.nvtx_range`` (push/pop), only
    ``kernel_names`` (demangled, as nsys reports them) when given, at most ``launch_count``
    launches."""
    opts = cfg.pipeline.ncu
    regex = "|".join(kernel_name_regex(name) for name in kernel_names) or None
    return ncu_profile_argv(
        workload_app_argv(run_dir, out / "app"),
        out / files.NCU_REPORT_STEM,
        ncu=ncu,
        preset=opts.preset,
        nvtx_include=opts.nvtx_range,
        kernel_regex=regex,
        kernel_name_base=KERNEL_NAME_BASE if regex else None,
        launch_count=opts.launch_count,
    )


def _write_command(out: Path, argv: Sequence[str], outcome: StepOutcome, **extra: Any) -> None:
    write_json(
        out / files.COMMAND,
        {"argv": list(argv), "status": outcome.status, "reason": outcome.reason, **extra},
    )


def _run(argv: Sequence[str], timeout_s: float, log: Path, runner: Runner) -> str | None:
    """Run ``argv``; append its output to ``log``; None on success, else why it failed."""
    try:
        proc = runner(list(argv), capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return f"{Path(argv[0]).name} timed out after {timeout_s:g} s"
    except OSError as exc:
        return f"{Path(argv[0]).name} could not start: {exc}"
    with log.open("a", encoding="utf-8") as handle:
        handle.write(f"$ {' '.join(argv)}\n{proc.stdout or ''}{proc.stderr or ''}\n")
    if proc.returncode != 0:
        tail = ((proc.stdout or "") + (proc.stderr or ""))[-LOG_TAIL_CHARS:]
        return f"{Path(argv[0]).name} exited with {proc.returncode}: {tail.strip()}"
    return None


def run_nsys(
    cfg: DeepProfileStageConfig,
    run_dir: Path,
    tool_path: str | None,
    gate: StepOutcome,
    runner: Runner = subprocess.run,
) -> tuple[StepOutcome, dict[str, Any]]:
    """Profile, export the stats CSVs, list the top kernels; skipped when ``gate`` says so."""
    out = (run_dir / files.NSYS_DIR).resolve()
    out.mkdir(parents=True, exist_ok=True)
    nsys = tool_path or "nsys"
    argv = nsys_argv(cfg, run_dir, out, nsys)
    report = out / f"{files.NSYS_REPORT_STEM}.nsys-rep"
    stats_argv = nsys_stats_argv(report, out / files.NSYS_STATS_PREFIX, nsys=nsys)
    _write_command(out, argv, gate, stats_argv=stats_argv)
    if gate.status != "ok":
        return gate, {}
    log = out / files.LOG
    report.unlink(missing_ok=True)  # a report left by an earlier try must not pass for this one's
    profile_error = _run(argv, cfg.pipeline.nsys.timeout_s, log, runner)
    # nsys 2025.3 on the lent H100 wrote its whole report ("Generated: ...") and then died with
    # SIGSEGV (exit 139) on the way out: the report is read, the crash is kept in the summary
    if profile_error is not None and not report.is_file():
        return StepOutcome.failed("nsys", profile_error), {}
    error = _run(stats_argv, cfg.pipeline.nsys.timeout_s, log, runner)
    if error is not None:
        return StepOutcome.failed("nsys", error), {}
    kern_sum = nsys_stats_outputs(out / files.NSYS_STATS_PREFIX, NSYS_STATS_REPORTS)[
        "cuda_gpu_kern_sum"
    ]
    if not kern_sum.is_file():
        return StepOutcome.failed("nsys", f"nsys stats wrote no {kern_sum.name}"), {}
    kernels = parse_kernel_summary(kern_sum)
    top = extract_top_kernels(kernels, cfg.pipeline.nsys.top_k) if kernels else []
    write_top_kernels_yaml(top, out / TOP_KERNELS_FILE, source=str(kern_sum))
    write_json(out / files.NSYS_KERNELS_JSON, {"kernels": [k.to_dict() for k in kernels]})
    summary: dict[str, Any] = {
        "num_kernels": len(kernels),
        "total_kernel_ms": sum(k.total_ms for k in kernels),
        "top_kernels": [k.to_dict() for k in top],
    }
    if profile_error is not None:
        summary["profile_exit"] = f"report written, then {profile_error}"
    return StepOutcome.ok("nsys"), summary


def top_kernel_names(run_dir: Path) -> list[str]:
    """Kernel names of the nsys step's ``top_kernels.yaml``; empty when there is none."""
    import yaml

    path = run_dir / files.NSYS_DIR / TOP_KERNELS_FILE
    if not path.is_file():
        return []
    doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return [str(k["name"]) for k in doc.get("kernels", [])]


def run_ncu(
    cfg: DeepProfileStageConfig,
    run_dir: Path,
    tool_path: str | None,
    gate: StepOutcome,
    runner: Runner = subprocess.run,
) -> tuple[StepOutcome, dict[str, Any]]:
    """Profile the top kernels (or every kernel in the NVTX range); classify their bounds."""
    out = (run_dir / files.NCU_DIR).resolve()
    out.mkdir(parents=True, exist_ok=True)
    ncu = tool_path or "ncu"
    names = top_kernel_names(run_dir) if cfg.pipeline.ncu.use_top_kernels else []
    argv = ncu_argv(cfg, run_dir, out, ncu, names)
    report = out / f"{files.NCU_REPORT_STEM}.ncu-rep"
    import_argv = ncu_import_csv_argv(report, ncu=ncu)
    _write_command(out, argv, gate, import_argv=import_argv, top_kernels=names)
    if gate.status != "ok":
        return gate, {}
    log = out / files.LOG
    report.unlink(missing_ok=True)  # a report left by an earlier try must not pass for this one's
    error = _run(argv, cfg.pipeline.ncu.timeout_s, log, runner)
    if error is not None:
        return StepOutcome.failed("ncu", error), {}
    if not report.is_file():  # ncu exits 0 with "No kernels were profiled" and no report
        matched = f"inside the NVTX range {cfg.pipeline.ncu.nvtx_range}/"
        if names:
            matched += f" named as the nsys step's {len(names)} top kernel(s)"
        return StepOutcome.failed(
            "ncu",
            f"ncu profiled no kernel: it wrote no {report.name} (no kernel ran {matched}); "
            f"its output is in {files.NCU_DIR}/{files.LOG}",
        ), {}
    try:
        proc = runner(
            import_argv, capture_output=True, text=True, timeout=cfg.pipeline.ncu.timeout_s
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return StepOutcome.failed("ncu", f"ncu --import failed: {exc}"), {}
    if proc.returncode != 0:
        tail = ((proc.stdout or "") + (proc.stderr or ""))[-LOG_TAIL_CHARS:].strip()
        return StepOutcome.failed("ncu", f"ncu --import exited with {proc.returncode}: {tail}"), {}
    details = out / files.NCU_DETAILS_CSV
    with atomic_open(details) as handle:
        handle.write(proc.stdout)
    bounds = classify_bound(parse_ncu_csv(details))
    write_json(out / files.NCU_BOUNDS_JSON, {"kernels": [b.to_dict() for b in bounds]})
    return StepOutcome.ok("ncu"), {"kernel_bounds": [b.to_dict() for b in bounds]}
