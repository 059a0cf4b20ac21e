"""Which steps does the model time wrong? A tune's checked servers, step class by step class.

A checked configuration's ``server_step_level`` says how much longer its server's busy steps
took than the simulation's step model timing the same steps, over all of them. A configuration
whose capacity stays off once simulated at that level (s8-t32 in the tune benchmarks, +17..+22%)
has some steps timed worse than others. This splits the same steps by what they hold: decodes
only, a whole prompt (its first chunk, nothing computed before), a prompt's later chunk (a
prefill over KV it computed in an earlier step: a token budget of 32 cuts 16..64-token prompts
into two or three), each with or without decodes beside it; per class, the measured seconds
over the modelled ones, and the steps' share of the busy time
(:mod:`gpu_simulate_test.calibration.step_classes`).

Run from the folder the tune ran in, with the tune's own overrides (the same bundle):
``python -m benchmarks.calibration.step_classes tmp/tune/<run_id> [overrides]``
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir

from gpu_simulate_test.calibration.level import Predict
from gpu_simulate_test.calibration.step_classes import classes
from gpu_simulate_test.cli.registry import CONFIG_DIR, register_configs
from gpu_simulate_test.config.registry import to_typed
from gpu_simulate_test.config.tune import TuneStageConfig
from gpu_simulate_test.core.traffic.workloads import load_workload
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import read_csv
from gpu_simulate_test.io.schemas import ENGINE_SCHEDULE
from gpu_simulate_test.tune.simulate import Simulated, TuneInputs, step_model
from gpu_simulate_test.tune.space import Candidate, candidates


def main(run_dir: Path, overrides: list[str]) -> None:
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        composed = compose("tune", overrides=overrides)
    cfg = to_typed(composed, TuneStageConfig)
    meta = json.loads((run_dir / "run_meta.json").read_text())
    workload_dir = Path(meta["workload_dir"])
    lengths = load_workload(workload_dir).lengths
    longest = int((lengths["num_prefill_tokens"] + lengths["num_decode_tokens"]).max())
    found = {c.config_id: c for c in candidates(cfg.tune, cfg.backend, cfg.model, longest)}
    with tempfile.TemporaryDirectory() as points:  # the step models' simulated points
        tuned = TuneInputs(
            cfg, cfg.pipeline(), workload_dir, int(lengths["num_prefill_tokens"].max()),
            Path(points),
        )  # fmt: skip
        print_classes(run_dir, found, step_model(tuned))


def print_classes(
    run_dir: Path,
    found: dict[str, Candidate],
    models: Callable[[Simulated], tuple[Predict, Any] | None],
) -> None:
    """Each checked configuration's table (:func:`classes`), under its name."""
    for checked in sorted((run_dir / "runs").iterdir()):
        candidate = found.get(checked.name)
        if candidate is None:
            continue
        schedules = [
            read_csv(path, ENGINE_SCHEDULE)
            for path in sorted((checked / "real_bench").glob(f"*/{layout.ENGINE_SCHEDULE}"))
        ]
        model = models(Simulated(candidate))
        if not schedules or model is None:
            continue
        table = classes(schedules, model)
        print(f"\n{checked.name}: {len(schedules)} runs")
        print(table.round({"measured_s": 2, "modelled_s": 2, "ratio": 3, "share": 3}).to_string())


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
