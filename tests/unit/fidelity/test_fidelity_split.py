"""The fidelity stage's split run: the manifest round trip, a real phase that never imports Vidur
and keeps the loads it measured, and the config's and the sim phase's refusals."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpu_simulate_test.config.fidelity import FidelityStageConfig
from gpu_simulate_test.config.registry import to_typed
from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.fidelity import manifest as man
from gpu_simulate_test.fidelity import tables as fid
from gpu_simulate_test.io.artifacts import ArtifactError

REPO = Path(__file__).resolve().parents[3]
FRACTIONS = (0.2, 0.5, 0.85)


def _backend(
    root: Path, backend: str, capacity: float, own_bundles: bool = False
) -> dict[str, Any]:
    loads = []
    for index, (fraction, qps) in enumerate(fid.load_levels(capacity, FRACTIONS)):
        run_id = f"{backend}-load{index}"
        load: dict[str, object] = {
            "load_fraction": fraction,
            "offered_qps": qps,
            "run_id": run_id,
            "workload_dir": str(root / "runs" / "workload" / run_id),
            "real_dir": str(root / "runs" / "real_bench" / run_id),
            "repeat_dirs": [str(root / "runs" / "real_bench" / f"{run_id}-r2")],
            "scheduler": {"name": "sarathi", "chunk_size": 256, "batch_size_cap": 8},
        }
        if own_bundles:
            load["profiling_root"] = str(root / "profiles" / f"load{index}")
        loads.append(load)
    return {
        "config": {"backend": {"name": backend}},
        "profiling_root": str(root / "profiles"),
        "capacity": {
            "probe_requests": 24,
            "probe_ok": 24,
            "probe_run": str(root / "runs" / "real_bench" / f"{backend}-capacity"),
            "capacity_qps": capacity,
            "output_tokens_per_s": 10.0,
        },
        "loads": loads,
    }


def _manifest(root: Path, rec: dict[str, Any], complete: bool = True) -> dict[str, Any]:
    return man.make_manifest(
        root, name="t", command="c", environment={"device": "CPU"}, requests_per_load=16,
        wall_time_s=1.0, backends={"hf_cb": rec}, load_fractions=FRACTIONS, complete=complete,
    )  # fmt: skip


def test_manifest_round_trip_keeps_the_load_plan(tmp_path: Path) -> None:
    manifest = _manifest(tmp_path, _backend(tmp_path, "hf_cb", 3.7, own_bundles=True))
    path = man.write_manifest(tmp_path, manifest)
    assert path.name == man.MANIFEST_FILE
    back = man.read_manifest(tmp_path)
    assert back == {**manifest, "manifest_version": man.MANIFEST_VERSION}  # the writer's to set
    plan = man.load_plan(back)
    assert [(p.index, p.load_fraction, p.offered_qps) for p in plan] == [
        (i, f, q) for i, (f, q) in enumerate(fid.load_levels(3.7, FRACTIONS))
    ]
    # paths under the run are relative to it, so the directory can be tarred and moved
    first = plan[0]
    assert (first.workload_dir, first.real_dir) == (
        "runs/workload/hf_cb-load0",
        "runs/real_bench/hf_cb-load0",
    )
    assert first.repeat_dirs == ("runs/real_bench/hf_cb-load0-r2",)
    assert back["backends"]["hf_cb"]["profiling_root"] == "profiles"
    assert back["backends"]["hf_cb"]["capacity"]["probe_run"] == "runs/real_bench/hf_cb-capacity"
    assert plan[-1].profiling_root == "profiles/load2"


def test_a_shared_bundle_outside_the_run_stays_absolute(tmp_path: Path) -> None:
    rec = _backend(tmp_path / "run", "hf_cb", 3.7)
    rec["profiling_root"] = str(tmp_path / "shared" / "profiles")  # phase=all reuses it
    manifest = _manifest(tmp_path / "run", rec)
    assert manifest["backends"]["hf_cb"]["profiling_root"] == str(tmp_path / "shared" / "profiles")
    # joined to the run directory, an absolute path is itself
    assert tmp_path / "run" / manifest["backends"]["hf_cb"]["profiling_root"] == (
        tmp_path / "shared" / "profiles"
    )


def test_manifest_refusals_name_the_file_and_field(tmp_path: Path) -> None:
    rec = _backend(tmp_path, "hf_cb", 3.7)
    rec["capacity"]["capacity_qps"] = 5.0
    man.write_manifest(tmp_path, _manifest(tmp_path, rec))
    with pytest.raises(ArtifactError, match=r"backends\.hf_cb\.loads .* are not the levels"):
        man.read_manifest(tmp_path)
    with pytest.raises(ArtifactError, match=r"no fidelity-manifest\.json in .*missing"):
        man.read_manifest(tmp_path / "missing")
    # a manifest of the old argparse harness: one line saying what to do
    old = tmp_path / "old"
    old.mkdir()
    (old / man.MANIFEST_FILE).write_text(json.dumps({"manifest_version": 1, "preset": "x"}))
    with pytest.raises(ArtifactError, match=r"manifest_version 1, expected 2 .*phase=real"):
        man.read_manifest(old)
    (old / man.MANIFEST_FILE).write_text("{not json")
    with pytest.raises(ArtifactError, match="not valid JSON"):
        man.read_manifest(old)


def test_a_real_phase_stopped_part_way_keeps_the_loads_it_measured(tmp_path: Path) -> None:
    rec = _backend(tmp_path, "hf_cb", 3.7)
    rec["loads"] = rec["loads"][:2]
    man.write_manifest(tmp_path, _manifest(tmp_path, rec, complete=False))
    back = man.read_manifest(tmp_path)
    assert [p.index for p in man.load_plan(back)] == [0, 1]
    assert man.missing_loads(back) == {"hf_cb": 1}
    # marked complete, two loads of three are a broken manifest, not a partial one
    man.write_manifest(tmp_path, _manifest(tmp_path, rec, complete=True))
    with pytest.raises(ArtifactError, match="not the levels"):
        man.read_manifest(tmp_path)


def test_real_phase_code_path_does_not_import_vidur() -> None:
    # vidur made unimportable; the stage and every module its real phase imports load, and
    # neither vidur nor the simulate stage get imported along the way
    code = """
import sys
sys.modules["vidur"] = None
import gpu_simulate_test.cli.fidelity
import gpu_simulate_test.fidelity.stage
import gpu_simulate_test.fidelity.real_phase as f
import gpu_simulate_test.orchestrate.profiling as p, gpu_simulate_test.orchestrate.serving as s
import gpu_simulate_test.orchestrate.steps as st
import gpu_simulate_test.vidur_profile.stage, gpu_simulate_test.real_bench.stage
import gpu_simulate_test.core.traffic.workloads
import inspect
src = "".join(inspect.getsource(fn) for fn in (
    f.real_phase, f.real_load, f.measure_capacity, p.profile_plan, p.ensure_bundle, s.served,
    st.make_workload, st.run_truth))
assert "vidur_simulate.stage" not in src and "compare.stage" not in src, "sim import in real path"
bad = [m for m, mod in sys.modules.items() if mod is not None and m.split(".")[0] == "vidur"]
assert not bad, bad
assert "gpu_simulate_test.vidur_simulate.stage" not in sys.modules
print("ok")
"""
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["fidelity.torch_threads=-1"], "fidelity.torch_threads must be >= 0"),
        (["fidelity.loads=[0.5,0.2]"], "must be increasing"),
        (["fidelity.loads=[0.5,1.5]"], r"1\.5 is not a fraction of capacity"),
        (["fidelity.phase=sim"], "needs fidelity.real_from"),
        (["fidelity.real_from=x"], "goes with fidelity.phase=sim only"),
        (["fidelity.phase=both"], "fidelity.phase='both' is not one of all, real, sim"),
        (["fidelity.real_repeats=0"], "fidelity.real_repeats must be >= 1"),
    ],
)
def test_bad_campaign_knobs_are_refused_naming_them(
    compose_stage: Any, overrides: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        to_typed(compose_stage("fidelity", overrides), FidelityStageConfig)


def _cfg(compose_stage: Any, tmp_path: Path, *overrides: str) -> FidelityStageConfig:
    return to_typed(
        compose_stage(
            "fidelity",
            ["backend=hf_cb", f"output.root={tmp_path}", "progress=false", *overrides],
        ),
        FidelityStageConfig,
    )


def test_phase_real_writes_the_manifest_after_every_load(
    compose_stage: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interrupted in its second load (Ctrl-C, a device call's time limit), the real phase
    leaves a manifest with the first load, marked incomplete, and its run marked interrupted;
    the sim phase reports it as partial, and refuses one with no load at all."""
    from gpu_simulate_test.fidelity import real_phase, stage

    calls: list[int] = []

    def one_load_then_ctrl_c(cfg: Any, opts: Any, index: int, fraction: float, qps: float,
                             needs: Any, *_: Any) -> tuple[dict[str, Any], Any]:  # fmt: skip
        calls.append(index)
        if index == 1:
            raise KeyboardInterrupt
        root = Path(cfg.output.root)
        return {
            "load_fraction": fraction, "offered_qps": qps, "run_id": f"hf_cb-load{index}",
            "workload_dir": str(root / "workload" / "x"),
            "real_dir": str(root / "real_bench" / "x"),
            "repeat_dirs": [], "scheduler": {"name": "sarathi"},
        }, needs  # fmt: skip

    monkeypatch.setattr(real_phase, "real_load", one_load_then_ctrl_c)
    monkeypatch.setattr(real_phase, "environment", lambda: {"device": "CPU"})
    cfg = _cfg(compose_stage, tmp_path, "fidelity.phase=real", "fidelity.capacity_qps=4",
               "output.run_id=r")  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        stage.run(cfg, {})
    run_dir = tmp_path / "fidelity" / "r"
    back = man.read_manifest(run_dir)
    assert back["complete"] is False
    assert [p.run_id for p in man.load_plan(back)] == ["hf_cb-load0"]
    assert man.missing_loads(back) == {"hf_cb": 2}
    assert back["backends"]["hf_cb"]["capacity"]["probe_run"] is None  # capacity given
    assert json.loads((run_dir / "run_meta.json").read_text())["status"] == "interrupted"
    source = stage.sim_source(run_dir)
    assert source["notes"] == ["the real phase stopped part-way: hf_cb without its last 2 load(s)"]
    # the sim phase names the missing real run instead of reporting a table without it
    sim = _cfg(compose_stage, tmp_path, "fidelity.phase=sim", f"fidelity.real_from={run_dir}",
               "output.run_id=s")  # fmt: skip
    with pytest.raises(ArtifactError, match=r"real_bench/x: run directory does not exist"):
        stage.run(sim, {})
    # stopped before its first load: nothing to simulate, said in one line
    calls.clear()
    monkeypatch.setattr(
        real_phase, "real_load", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt)
    )
    early = _cfg(compose_stage, tmp_path, "fidelity.phase=real", "fidelity.capacity_qps=4",
                 "output.run_id=r0")  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        stage.run(early, {})
    with pytest.raises(ArtifactError, match="stopped before its first load"):
        stage.sim_source(tmp_path / "fidelity" / "r0")
    with pytest.raises(ArtifactError, match="no such directory"):
        stage.sim_source(tmp_path / "nowhere")


def test_probe_size_by_backend(compose_stage: Any, tmp_path: Path) -> None:
    from gpu_simulate_test.fidelity.real_phase import probe_size

    cfg = _cfg(compose_stage, tmp_path, "backend.max_num_seqs=8").pipeline()
    assert probe_size(cfg, 0) == 64
    wide = _cfg(compose_stage, tmp_path, "backend.max_num_seqs=32").pipeline()
    assert probe_size(wide, 0) == 96
    one = _cfg(compose_stage, tmp_path, "backend=hf_generate").pipeline()
    assert probe_size(one, 0) == 16
    assert probe_size(one, 40) == 40
