"""The split fidelity run: the manifest round trip, and a real phase that never imports Vidur."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from gpu_simulate_test.analysis import fidelity as fid

REPO = Path(__file__).resolve().parents[2]


def _backend(
    root: Path, backend: str, capacity: float, own_bundles: bool = False
) -> dict[str, object]:
    loads = []
    for index, (fraction, qps) in enumerate(fid.load_levels(capacity)):
        run_id = f"t-{backend}-load{index}"
        load: dict[str, object] = {
            "load_fraction": fraction,
            "offered_qps": qps,
            "run_id": run_id,
            "workload_dir": str(root / "workload" / run_id),
            "real_dir": str(root / "real_bench" / run_id),
            "scheduler": {"name": "sarathi", "chunk_size": 256, "batch_size_cap": 8},
        }
        if own_bundles:
            load["profiling_root"] = str(root / "profiles" / backend / f"load{index}")
        loads.append(load)
    return {
        "overrides": ["model=qwen3_tiny", f"backend={backend}"],
        "profiling_root": str(root / "profiles" / backend),
        "capacity": {
            "probe_requests": 24,
            "probe_ok": 24,
            "probe_run": str(root / "real_bench" / f"t-{backend}-capacity"),
            "capacity_qps": capacity,
            "output_tokens_per_s": 10.0,
        },
        "loads": loads,
    }


def test_manifest_round_trip_keeps_the_load_plan(tmp_path: Path) -> None:
    backends = {
        "hf_cb": _backend(tmp_path, "hf_cb", 3.7),
        # --calibrate-each-load: its loads have their own bundles
        "hf_generate": _backend(tmp_path, "hf_generate", 1.1, own_bundles=True),
    }
    manifest = fid.make_manifest(
        tmp_path,
        preset="cpu_tiny",
        name="t",
        command="python -m benchmarks.fidelity --phase real",
        environment={"device": "CPU", "driver": "n/a", "versions": {"torch": "x"}},
        requests_per_load=16,
        wall_time_s=1.0,
        backends=backends,
    )
    path = fid.write_manifest(tmp_path, manifest)
    assert path.name == fid.MANIFEST_FILE
    back = fid.read_manifest(tmp_path)
    assert back == manifest
    plan = fid.load_plan(back)
    assert [(p.backend, p.index, p.load_fraction, p.offered_qps) for p in plan] == [
        (b, i, f, q)
        for b, cap in (("hf_cb", 3.7), ("hf_generate", 1.1))
        for i, (f, q) in enumerate(fid.load_levels(cap))
    ]
    # paths are relative to the root, so the directory can be tarred and moved
    first = plan[0]
    assert (first.workload_dir, first.real_dir) == (
        "workload/t-hf_cb-load0",
        "real_bench/t-hf_cb-load0",
    )
    assert back["backends"]["hf_cb"]["profiling_root"] == "profiles/hf_cb"
    assert back["backends"]["hf_cb"]["capacity"]["probe_run"] == "real_bench/t-hf_cb-capacity"
    assert first.scheduler["chunk_size"] == 256
    assert first.profiling_root == ""  # the backend's bundle
    assert plan[-1].profiling_root == "profiles/hf_generate/load2"


def test_manifest_rejects_loads_that_are_not_the_capacity_levels(tmp_path: Path) -> None:
    rec = _backend(tmp_path, "hf_cb", 3.7)
    rec["capacity"]["capacity_qps"] = 5.0  # type: ignore[index]
    manifest = fid.make_manifest(
        tmp_path, preset="p", name="t", command="c", environment={}, requests_per_load=1,
        wall_time_s=0.0, backends={"hf_cb": rec},
    )  # fmt: skip
    fid.write_manifest(tmp_path, manifest)
    with pytest.raises(ValueError, match="not the levels"):
        fid.read_manifest(tmp_path)
    with pytest.raises(ValueError, match=r"no fidelity-manifest\.json"):
        fid.read_manifest(tmp_path / "missing")


def test_real_phase_code_path_does_not_import_vidur() -> None:
    # vidur made unimportable; the harness and every module its real phase imports load, and
    # neither vidur nor the simulate stage get imported along the way
    code = """
import sys
sys.modules["vidur"] = None
import benchmarks.fidelity as f
import gpu_simulate_test.profiling.vidur_profile, gpu_simulate_test.real_bench.stage
import gpu_simulate_test.workloads.build
import inspect
src = inspect.getsource(f.real_backend) + inspect.getsource(f.measure_capacity)
src += inspect.getsource(f.phase_real) + inspect.getsource(f.scheduler_needs)
assert "vidur_ext.simulate" not in src and "analysis.stage" not in src, "sim import in real path"
assert "pipeline_run" not in src
bad = [m for m, mod in sys.modules.items() if mod is not None and m.split(".")[0] == "vidur"]
assert not bad, bad
assert "gpu_simulate_test.vidur_ext.simulate" not in sys.modules
print("ok")
"""
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_bad_thread_count_is_refused_before_any_run(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.fidelity import PRESETS, main

    assert PRESETS["cpu_tiny"].torch_threads == 1  # the stable setting on 2 shared cores
    with pytest.raises(SystemExit) as exc:
        main(["--preset", "cpu_tiny", "--torch-threads", "-1", "--out", "unused"])
    assert exc.value.code == 2
    assert "--torch-threads must be >= 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # thread count and calibration shape the real runs only
        main(["--phase", "sim", "--from", "unused", "--torch-threads", "1"])
    assert "give them to --phase real" in capsys.readouterr().err


def _incomplete(tmp_path: Path, loads: int, complete: bool) -> dict[str, object]:
    rec = _backend(tmp_path, "hf_cb", 3.7)
    rec["loads"] = rec["loads"][:loads]  # type: ignore[index]
    return fid.make_manifest(
        tmp_path, preset="p", name="t", command="c", environment={}, requests_per_load=1,
        wall_time_s=0.0, backends={"hf_cb": rec}, complete=complete,
    )  # fmt: skip


def test_a_real_phase_stopped_part_way_keeps_the_loads_it_measured(tmp_path: Path) -> None:
    fid.write_manifest(tmp_path, _incomplete(tmp_path, 2, complete=False))
    back = fid.read_manifest(tmp_path)
    assert [p.index for p in fid.load_plan(back)] == [0, 1]
    assert fid.missing_loads(back) == {"hf_cb": 1}
    # marked complete, two loads of three are a broken manifest, not a partial one
    fid.write_manifest(tmp_path, _incomplete(tmp_path, 2, complete=True))
    with pytest.raises(ValueError, match="not the levels"):
        fid.read_manifest(tmp_path)


def test_phase_real_writes_the_manifest_after_every_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interrupted in its second load (Ctrl-C, a device call's time limit), the real phase
    leaves a manifest with the first load, marked incomplete."""
    import benchmarks.fidelity as harness

    full = _backend(tmp_path, "hf_cb", 3.7)

    def one_load_then_ctrl_c(
        preset: object, backend: str, name: str, out: Path, measured: Callable[[object], None]
    ) -> None:
        loads: list[object] = []
        record = {**full, "loads": loads}
        measured(record)
        loads.append(full["loads"][0])  # type: ignore[index]
        measured(record)
        raise KeyboardInterrupt

    monkeypatch.setattr(harness, "real_backend", one_load_then_ctrl_c)
    monkeypatch.setattr(harness, "environment", lambda: {"device": "CPU"})
    with pytest.raises(KeyboardInterrupt):
        harness.phase_real(
            "cpu_tiny", harness.PRESETS["cpu_tiny"], ("hf_cb",), "t", tmp_path, "cmd"
        )
    back = fid.read_manifest(tmp_path)
    assert back["complete"] is False
    assert [p.run_id for p in fid.load_plan(back)] == ["t-hf_cb-load0"]
    assert fid.missing_loads(back) == {"hf_cb": 2}
