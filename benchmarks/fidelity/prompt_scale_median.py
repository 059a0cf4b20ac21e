"""A fidelity sim phase with a prompt step's ops scaled by the median ratio, not the smallest.

The overhead fit (``calibration/overhead.py`` ``_scale``) scales the ops of a step carrying a
prompt, where they exceed what the measured steps leave them, by the smallest ratio of room to
ops over its calibrated steps, so that no step's overhead is negative; with a dozen such steps,
one measured under its batch size's decode median drives that ratio to 0 (``prompt_ops_scale``
0.0 in ``run_meta.json``'s ``engine_overhead``). This runs the fidelity stage with the median
ratio instead (below 1 only), for ``bench_campaign_variants`` to set beside the campaign's own
simulation: the stage's arguments pass through.

Run: ``python -m benchmarks.fidelity.prompt_scale_median fidelity.phase=sim
fidelity.real_from=tmp/fidelity/<campaign> output.run_id=<id> progress=false``
"""

from __future__ import annotations

import numpy as np

from gpu_simulate_test.calibration import overhead


def median_scale(room: np.ndarray, ops: np.ndarray) -> float:
    """1 unless the median ratio of room to ops is below 1; then that median (at least 0)."""
    usable = ops > 0
    if not usable.any():
        return 1.0
    median = float(np.median(room[usable] / ops[usable]))
    return 1.0 if median >= 1.0 else max(0.0, median)


def main() -> None:
    overhead._scale = median_scale  # the one rule changed, for this process only
    from gpu_simulate_test.cli import fidelity

    fidelity.main()


if __name__ == "__main__":
    main()
