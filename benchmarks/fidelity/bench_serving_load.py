"""Issue 28's targets on the fidelity stage: the simulator within the truth's own noise.

Runs the fidelity stage (tiny Qwen3 against a real vLLM server on CPU, fresh profile and
calibration with its replays under load, 3 loads, the real side twice) on the default shape
and on a bursty one (gamma arrivals, burstiness 0.25), then simulates the same real runs again
without the serving terms (``fidelity.phase=sim vidur.serving_load=false``: the before, on the
same truth), and prints per campaign and clock: the mean signed error over the 18 rows, the
median and largest absolute error, the real-vs-real median and largest, and whether the targets
hold (mean signed within ±3%; median ≤ max(5%, real-vs-real median); largest ≤ max(10%,
real-vs-real largest)).

Run: ``python -m benchmarks.fidelity.bench_serving_load [--campaign DIR ...] [--out F.json]``; with
``--campaign`` it reads finished campaigns (``tmp/fidelity/<run_id>``) instead of running.
``--before OVERRIDE`` says what the before turns off (default ``vidur.serving_load=false``; the
front end as a queue: ``vidur.frontend_queue=false``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

SHAPES: dict[str, tuple[str, ...]] = {
    "default": (),
    "bursty": ("workload.arrival.process=gamma", "workload.arrival.burstiness=0.25"),
}


def cli(*overrides: str) -> None:
    cmd = [sys.executable, "-m", "gpu_simulate_test.cli.fidelity", "progress=false", *overrides]
    print("$ " + " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def figures(campaign: Path) -> dict[str, dict[str, float]]:
    """Per clock: mean signed, median and largest absolute error, and the noise floor (%)."""
    rows = json.loads((campaign / "fidelity.json").read_text())["rows"]
    out: dict[str, dict[str, float]] = {}
    for clock in ("engine", "client"):
        mine = [r for r in rows if r["clock"] == clock and r["rel_error"] is not None]
        if not mine:
            continue
        errors = sorted(100 * r["rel_error"] for r in mine)
        absolute = sorted(abs(e) for e in errors)
        noise = sorted(abs(100 * r["noise"]) for r in mine if r.get("noise") is not None)
        median = (
            absolute[len(absolute) // 2]
            if len(absolute) % 2
            else (absolute[len(absolute) // 2 - 1] + absolute[len(absolute) // 2]) / 2
        )
        noise_median = noise[len(noise) // 2] if noise else float("nan")
        both = [
            100 * (r["sim_ms"] / ((r["real_ms"] + r["real_repeat_ms"]) / 2) - 1)
            for r in mine
            if r.get("real_repeat_ms") is not None
        ]
        out[clock] = {
            "rows": len(mine),
            "mean_signed_vs_both": sum(both) / len(both) if both else float("nan"),
            "median_abs_vs_both": sorted(abs(e) for e in both)[len(both) // 2]
            if both
            else float("nan"),
            "mean_signed": sum(errors) / len(errors),
            "median_abs": median,
            "largest_abs": absolute[-1],
            "noise_median": noise_median,
            "noise_largest": noise[-1] if noise else float("nan"),
        }
        f = out[clock]
        f["meets_mean"] = abs(f["mean_signed"]) <= 3.0
        f["meets_median"] = f["median_abs"] <= max(5.0, f["noise_median"])
        f["meets_largest"] = f["largest_abs"] <= max(10.0, f["noise_largest"])
    return out


def show(name: str, figs: dict[str, dict[str, float]]) -> None:
    for clock, f in figs.items():
        marks = "".join(
            "✓" if f[k] else "✗" for k in ("meets_mean", "meets_median", "meets_largest")
        )
        print(
            f"{name:28s} {clock:6s} mean {f['mean_signed']:+6.1f}%  median {f['median_abs']:5.1f}%"
            f"  largest {f['largest_abs']:5.1f}%  | real vs real median {f['noise_median']:4.1f}%"
            f" largest {f['noise_largest']:5.1f}%  targets {marks}"
            f"  | vs both real runs: mean {f['mean_signed_vs_both']:+5.1f}%"
            f" median {f['median_abs_vs_both']:4.1f}%"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--campaign", nargs="*", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--before", default="vidur.serving_load=false")
    args, overrides = parser.parse_known_args()
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    campaigns: dict[str, Path] = {}
    if args.campaign:
        campaigns = {c.name: c for c in args.campaign}
    else:
        for shape, extra in SHAPES.items():
            run_id = f"serving-{shape}-{stamp}"
            cli(f"output.run_id={run_id}", *extra, *overrides)
            campaigns[run_id] = Path("tmp") / "fidelity" / run_id
            before = f"{run_id}-before"
            cli(
                "fidelity.phase=sim",
                f"fidelity.real_from={campaigns[run_id]}",
                f"output.run_id={before}",
                args.before,
                *extra,
                *overrides,
            )
            campaigns[before] = Path("tmp") / "fidelity" / before
    results = {name: figures(path) for name, path in campaigns.items()}
    for name, figs in results.items():
        show(name, figs)
    if args.out is not None:
        args.out.write_text(json.dumps({"date": stamp, "before": args.before, "campaigns": {
            name: {"path": str(campaigns[name]), "figures": figs} for name, figs in results.items()
        }}, indent=2) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
