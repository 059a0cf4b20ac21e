"""Several fresh calibrations against the real grids: one alone, the median one, the median per
configuration.

``tune.calibrations=K`` simulates the space with K calibrations and answers with the median one
(``gpu_simulate_test.tune.calibrations``). This reads K ``tune.verify=false`` runs made back to
back on fresh bundles (``profiling_root=tmp/profiles_c<k>``) and the real grids
(``tune.verify=grid``: every configuration's capacity measured on a server of its own), and
judges with ``bench_tune``'s rules (simulated within ±15% of the grids' mean or within their
spread, Spearman against the mean, the measured best in the simulated top 2):

- each calibration alone (what a tune with ``tune.calibrations=1`` would have answered);
- the median calibration (by the geometric mean of its capacities: the tune's choice);
- the median per configuration (not what the tune answers: a bound on what pooling could give).

Run: ``python -m benchmarks.capacity_tune.calibration_ensemble --calibrations tmp/tune/cal-1
tmp/tune/cal-2 tmp/tune/cal-3 --grids tmp/tune/grid-1 tmp/tune/grid-2 [--out F.json]``
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gpu_simulate_test.io.artifacts import write_json
from gpu_simulate_test.tune.judge import analyse, render


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calibrations", nargs="+", type=Path, required=True)
    parser.add_argument("--grids", nargs="+", type=Path, required=True)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = analyse(args.calibrations, args.grids)
    text = render(result)
    print(text)
    if args.out:
        write_json(args.out, result)
        args.out.with_suffix(".md").write_text(text + "\n")


if __name__ == "__main__":
    main()
