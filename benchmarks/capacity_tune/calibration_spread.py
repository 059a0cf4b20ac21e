"""How far apart fresh calibrations of the same moment put the tune's answers.

The tune's capacities move from calibration to calibration (``tune_errors.py``: 7–13% CV per
configuration over four benchmarks, hours apart). Part of that is the host's moment (every
server started then runs at that speed), part the calibration's own server and its sampling.
Run the same space with ``tune.verify=false`` on several fresh bundles made back to back
(``profiling_root=tmp/profiles_<k>``, one per run) and read them here: per configuration the
simulated capacity of each, their CV and range. A spread as wide back to back as hours apart
says the calibration's server and sampling, not the moment, set it: more than one server (or a
longer calibration) would narrow it; a narrow one says the moment does.

Run: ``python -m benchmarks.capacity_tune.calibration_spread <tune run dir> [<tune run dir> ...]``
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pandas as pd


def capacities(run: Path) -> pd.Series:
    """A tune run's simulated capacity per configuration (``tune.csv``)."""
    path = run / "tune.csv"
    if not path.is_file():
        raise SystemExit(f"calibration_spread: {path}: no tune.csv (a tune run directory expected)")
    table = pd.read_csv(path)
    return table.set_index("config_id")["capacity_qps"].astype(float).rename(run.name)


def main() -> None:
    runs = [Path(p) for p in sys.argv[1:]]
    if len(runs) < 2:
        raise SystemExit(__doc__.split("Run: ")[-1].strip())
    frame = pd.concat([capacities(run) for run in runs], axis=1).sort_index()
    names = list(frame.columns)
    print("| configuration | " + " | ".join(names) + " | CV | max / min |")
    print("| --- " * (len(names) + 3) + "|")
    cvs = []
    for config, row in frame.iterrows():
        values = [float(v) for v in row if pd.notna(v)]
        cv = statistics.pstdev(values) / statistics.fmean(values)
        cvs.append(cv)
        cells = " | ".join(f"{v:.2f}" for v in row)
        print(f"| {config} | {cells} | {cv:.1%} | {max(values) / min(values):.2f} |")
    print(f"\nmedian CV over the configurations: {statistics.median(cvs):.1%}")


if __name__ == "__main__":
    main()
