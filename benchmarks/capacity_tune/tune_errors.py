"""Which of the tune's capacity errors are the model's and which are the host's.

Per configuration over the calibrations of several ``bench_tune`` result folders: the simulated
capacity over the mean measured one, its signs, the truth's and the simulation's spreads and the
verdict (model gap or noise), as :mod:`gpu_simulate_test.tune.grid_errors` reads them.

Run: ``python -m benchmarks.capacity_tune.tune_errors benchmarks/results/tune_2026112*``
[``--out F.json``].
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gpu_simulate_test.io.artifacts import write_json
from gpu_simulate_test.tune.grid_errors import analyse, render


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    try:
        result = analyse(args.folders)
    except (OSError, ValueError, KeyError) as exc:
        raise SystemExit(f"tune_errors: {exc}") from None
    print(render(result))
    if args.out:
        write_json(args.out, result)


if __name__ == "__main__":
    main()
