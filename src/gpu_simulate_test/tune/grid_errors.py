"""Which of the tune's capacity errors are the model's and which are the host's.

Reads the real grids of several tune benchmark result folders (each folder: one calibration, its
grids' ``grid*/tune.json``, every configuration's capacity measured by the real search on a
server of its own; ``benchmarks/capacity_tune/bench_tune.py`` writes them) and sets, per
configuration, the simulated capacity over the mean measured one (``simulated / measured - 1``)
side by side over the calibrations. The guide's rule: an error of one sign over many
calibrations is a model gap; one of both signs within the truth's own spread is noise. Beside
each configuration:

- ``errors``: one per calibration, and how many are above and below 0;
- ``measured_cv`` / ``simulated_cv``: how much the truth moved over every grid server, and how much
  the simulation moved over the calibrations (the calibration's moment of the host's speed);
- ``relative``: each error less its calibration's mean error over all configurations (the
  calibration's common speed taken out): what is the configuration's own;
- ``verdict``: ``model gap`` where the errors (and the relative errors) never take both signs
  (a zero takes either) and the mean is beyond the truth's spread, ``noise`` otherwise; with
  four calibrations one sign comes by chance one time in eight: a gap here is a lead, not a
  proof.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any


def grids(folder: Path) -> list[dict[str, Any]]:
    """The folder's real grids (``grid*/tune.json``), each the configurations' rows."""
    docs = []
    for path in sorted(folder.glob("grid*/tune.json")):
        doc = json.loads(path.read_text())
        verify = doc.get("verify") or {}
        if verify.get("mode") != "grid":
            raise ValueError(f"{path}: verify.mode is {verify.get('mode')!r}, expected 'grid'")
        docs.append(doc)
    if not docs:
        raise ValueError(f"{folder}: no grid*/tune.json (a bench_tune result folder expected)")
    return docs


def calibration(folder: Path) -> dict[str, dict[str, Any]]:
    """Per configuration: the simulated capacity (one calibration: the same in every grid) and
    the measured ones, one per grid."""
    out: dict[str, dict[str, Any]] = {}
    for doc in grids(folder):
        for row in doc["verify"]["configs"]:
            entry = out.setdefault(row["config_id"], {"simulated": None, "measured": []})
            entry["simulated"] = row["simulated_qps"]
            if row["measured_qps"] is not None:
                entry["measured"].append(float(row["measured_qps"]))
    return out


def _cv(values: list[float]) -> float:
    return statistics.pstdev(values) / statistics.fmean(values) if len(values) > 1 else 0.0


def _one_sign(values: list[float]) -> bool:
    """Never on both sides of 0 (a zero, a capacity found exactly, takes either side) and off 0
    at least once."""
    return any(values) and (all(e >= 0 for e in values) or all(e <= 0 for e in values))


def analyse(folders: list[Path]) -> dict[str, Any]:
    """Per configuration over the folders' calibrations: the errors, their signs, the spreads
    and the verdict (see the module's docstring); per calibration its mean error."""
    per_cal = {folder.name: calibration(folder) for folder in folders}
    errors: dict[str, dict[str, float]] = {}
    for name, rows in per_cal.items():
        for config, entry in rows.items():
            if entry["simulated"] and entry["measured"]:
                mean = statistics.fmean(entry["measured"])
                errors.setdefault(config, {})[name] = entry["simulated"] / mean - 1
    offsets = {
        name: statistics.fmean(errors[c][name] for c in errors if name in errors[c])
        for name in per_cal
    }
    configs: dict[str, Any] = {}
    for config in sorted(errors):
        mine = errors[config]
        found = [rows[config] for rows in per_cal.values() if config in rows]
        measured = [m for entry in found for m in entry["measured"]]
        simulated = [entry["simulated"] for entry in found]
        relative = [e - offsets[name] for name, e in mine.items()]
        values = list(mine.values())
        spread = _cv(measured)
        one_sign, rel_sign = _one_sign(values), _one_sign(relative)
        gap = one_sign and rel_sign and abs(statistics.fmean(values)) > spread
        configs[config] = {
            "errors": {name: round(e, 4) for name, e in mine.items()},
            "above": sum(e > 0 for e in values),
            "below": sum(e < 0 for e in values),
            "mean_error": round(statistics.fmean(values), 4),
            "relative": [round(e, 4) for e in relative],
            "mean_relative": round(statistics.fmean(relative), 4),
            "measured_cv": round(spread, 4),
            "measured_range_qps": [min(measured), max(measured)],
            "simulated_cv": round(_cv(simulated), 4),
            "simulated_range_qps": [min(simulated), max(simulated)],
            "verdict": "model gap" if gap else "noise",
        }
    return {
        "calibrations": list(per_cal),
        "calibration_mean_error": {name: round(v, 4) for name, v in offsets.items()},
        "configs": configs,
    }


def render(result: dict[str, Any]) -> str:
    names = result["calibrations"]
    lines = [
        "| configuration | " + " | ".join(names) + " | + / − | mean | mean less the "
        "calibration's | truth CV | simulation CV | verdict |",
        "| --- " * (len(names) + 7) + "|",
    ]
    for config, row in result["configs"].items():
        cells = [f"{row['errors'][n]:+.1%}" if n in row["errors"] else "–" for n in names]
        lines.append(
            f"| {config} | " + " | ".join(cells) + f" | {row['above']} / {row['below']} | "
            f"{row['mean_error']:+.1%} | {row['mean_relative']:+.1%} | {row['measured_cv']:.1%} | "
            f"{row['simulated_cv']:.1%} | {row['verdict']} |"
        )
    offsets = ", ".join(f"{n} {v:+.1%}" for n, v in result["calibration_mean_error"].items())
    lines.append("")
    lines.append(f"each calibration's mean error over the configurations: {offsets}")
    return "\n".join(lines)
