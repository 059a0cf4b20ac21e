"""What each load's compare sets beside its real run in the fidelity stage's sim phase."""

from __future__ import annotations

from pathlib import Path

from gpu_simulate_test.fidelity.manifest import PlannedLoad
from gpu_simulate_test.fidelity.sim_phase import truth_beside


def _attempt(name: str, disturbed: bool) -> dict[str, object]:
    return {"real_dir": f"runs/real_bench/{name}", "disturbed": disturbed, "reasons": []}


def test_a_load_s_compare_gets_its_repeat_and_the_attempts_re_runs_replaced(
    tmp_path: Path,
) -> None:
    """A load's summary read "no repeat of the truth" and "the real run undisturbed" while the
    campaign's report counted its repeat and two disturbed attempts re-run."""
    for name in ("hf_cb-load0", "hf_cb-load0-rerun1", "hf_cb-load0-rerun2", "hf_cb-load0-r2"):
        (tmp_path / "runs" / "real_bench" / name).mkdir(parents=True)
    first = {"attempts": [_attempt("hf_cb-load0", True), _attempt("hf_cb-load0-rerun1", True),
                          _attempt("hf_cb-load0-rerun2", False)]}  # fmt: skip
    repeat = {"attempts": [_attempt("hf_cb-load0-r2", False)]}
    gone = {"attempts": [_attempt("moved-away", True), _attempt("hf_cb-load0-r3", False)]}
    load = PlannedLoad(
        "hf_cb", 0, 0.2, 3.6, "hf_cb-load0", "runs/workload/w",
        "runs/real_bench/hf_cb-load0-rerun2", {},
        repeat_dirs=("runs/real_bench/hf_cb-load0-r2",), truth=(first, repeat, gone),
    )  # fmt: skip
    got_repeat, replaced = truth_beside(load, tmp_path)
    assert got_repeat == tmp_path / "runs/real_bench/hf_cb-load0-r2"
    assert replaced == (
        tmp_path / "runs/real_bench/hf_cb-load0",
        tmp_path / "runs/real_bench/hf_cb-load0-rerun1",
    )  # the kept attempts are not replaced; one moved away is not named
    plain = PlannedLoad("vllm", 0, 0.5, 9.0, "l", "w", "r", {})  # an import: neither
    assert truth_beside(plain, tmp_path) == (None, ())
