"""Does the calibration replays' way of sending slow the server's steps? One server, one rate,
replays alternating between a 2 ms spin before each send and the real bench's 0.5 ms.

Runs ``vidur_profile`` with the engine calibration (a vLLM server, the default campaign's knobs)
and its replays at one rate (``engine.serving_rates=[0.5]``, ``engine.serving_rounds=12``): even
replays spin 2 ms before each send, odd ones 0.5 ms. Prints per replay its busy steps' time over
the median time of steps of the same composition across all replays (the composition taken
out), the median 4-request decode step, and per spin the mean and spread.

Run: ``python -m benchmarks.calibration.bench_replay_spin [HYDRA OVERRIDES]`` (``profiling_root``
and ``output.run_id`` where the bundle goes; the bundle's ``serving_steps.csv`` is read).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

SPINS_S = (0.002, 0.0005)
ARGS = (
    "engine.enable=true",
    "engine.backend.name=vllm",
    "engine.backend.max_num_batched_tokens=256",
    "engine.backend.block_size=32",
    "engine.backend.num_gpu_blocks_override=256",
    "engine.serving_rates=[0.5]",
    "engine.serving_rounds=12",
)
Run = Callable[[Any, Any, Any, float], list[tuple[float, float, float]]]


def alternating(run: Run) -> Run:
    """``run`` (:func:`gpu_simulate_test.calibration.serving_replay.run` itself) one replay at a
    time, the spin alternating between them."""
    from gpu_simulate_test.calibration import serving_replay

    def each(
        backend: Any, recorder: Any, replays: Any, timeout_s: float
    ) -> list[tuple[float, float, float]]:
        windows = []
        for k, replay in enumerate(replays):
            spin = SPINS_S[k % 2]

            def spun(backend: Any, spin: float = spin) -> float:
                return spin

            serving_replay.spin_window_s = spun
            windows += run(backend, recorder, [replay], timeout_s)
        return windows

    return each


def by_replay(steps: pd.DataFrame) -> pd.DataFrame:
    """Per replay: busy time over the same compositions' medians, steps, sends, 4-decode ms."""
    steps = steps.assign(ms=(steps.end_time_s - steps.start_time_s) * 1e3)
    busy = steps[(steps.num_prefill_requests + steps.num_decode_requests) > 0]
    busy = busy.assign(chunk=busy.num_prefill_tokens // 32)
    med = busy.groupby(["num_prefill_requests", "chunk", "num_decode_requests"])["ms"].transform(
        "median"
    )
    rows = []
    for key, g in busy.groupby("replay"):
        replay = int(str(key))
        four = g[(g.num_prefill_requests == 0) & (g.num_decode_requests == 4)].ms
        rows.append(
            {
                "replay": replay,
                "spin_ms": SPINS_S[replay % 2] * 1e3,
                "over_composition": g.ms.sum() / med[g.index].sum(),
                "steps": len(g),
                "sends": int(g.client_sends.sum()),
                "decode4_ms": four.median(),
            }
        )
    return pd.DataFrame(rows).set_index("replay")


def main() -> None:
    from gpu_simulate_test.calibration import serving_replay
    from gpu_simulate_test.cli import vidur_profile

    serving_replay.run = alternating(serving_replay.run)  # type: ignore[assignment]
    overrides = sys.argv[1:]
    sys.argv = [sys.argv[0], *ARGS, *overrides]
    try:
        vidur_profile.main()
    except SystemExit as exc:
        if exc.code:
            raise
    root = next((o.split("=", 1)[1] for o in overrides if o.startswith("profiling_root=")), None)
    found = sorted(Path(root or "tmp/profiles").glob("**/serving_steps.csv"))
    table = by_replay(pd.read_csv(found[-1]))
    print(table.round(3).to_string())
    print(table.groupby("spin_ms")[["over_composition", "decode4_ms"]].agg(["mean", "std"]))


if __name__ == "__main__":
    main()
