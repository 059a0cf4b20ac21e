"""The front end alone: the calibrated queue against the calibrated constant, on real runs.

Issue 28, item 3. Each real vLLM run records, per request, when the engine made its first and
last token (the engine's own stamps) and when the client got them. Holding the engine's side to
the truth (its own steps, ``engine_schedule.csv``), the client's clock is predicted by each
front-end model of the bundle's calibration (made on its own replays, seed 104729, never on the
runs judged):

- **constant**: every token reaches the client ``frontend.output_ms`` after its step;
- **queue**: :class:`gpu_simulate_test.calibration.frontend_queue.FrontEndQueue` over the run's real
  steps and sends (``frontend.queue``).

Printed per run: the client's TTFT, TPOT and E2E at p50 and p90, real and predicted by each,
and each model's error; then per model the mean signed and the median and largest absolute error
over every row. The engine's side is the truth in both, so what differs is the front end alone.

Run: ``python -m benchmarks.fidelity.bench_frontend_queue CAMPAIGN [--out F.json]`` with a fidelity
run directory (``tmp/fidelity/<run_id>``: its bundle under ``profiles/``, its real runs under
``runs/real_bench/``).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.calibration.frontend_queue import FrontEndQueue, request_delays_s
from gpu_simulate_test.core.metrics.latency import tpot_s

METRICS = ("ttft", "tpot", "e2e")
STATS = (50, 90)


def _bundle_meta(campaign: Path) -> dict[str, Any]:
    metas = sorted((campaign / "profiles").glob("*/*/meta.json"))
    if not metas:
        raise SystemExit(f"{campaign}: no profiles/<hardware>/<model>/meta.json")
    meta: dict[str, Any] = json.loads(metas[0].read_text())
    return meta


def _client_times(
    run: Path, first_s: np.ndarray, last_s: np.ndarray
) -> dict[str, dict[str, np.ndarray]]:
    """Per metric: the real client's values and each model's (seconds, ok requests)."""
    req = pd.read_csv(run / "request_metrics.csv")
    ok = (req["status"] == "ok").to_numpy() & req["engine_first_token_time_s"].notna().to_numpy()
    sent = req["arrival_time_s"].to_numpy(dtype=float)
    engine_first = req["engine_first_token_time_s"].to_numpy(dtype=float)
    engine_last = req["engine_last_token_time_s"].to_numpy(dtype=float)
    decode = req["num_decode_tokens"].to_numpy()
    out: dict[str, dict[str, np.ndarray]] = {m: {} for m in METRICS}
    for name, first, last in (
        ("real", req["first_token_time_s"].to_numpy(dtype=float), None),
        ("model", engine_first + first_s, engine_last + last_s),
    ):
        last = req["last_token_time_s"].to_numpy(dtype=float) if last is None else last
        ttft, e2e = first - sent, last - sent
        for metric, values in zip(
            METRICS, (ttft, np.asarray(tpot_s(ttft, e2e, decode)), e2e), strict=True
        ):
            out[metric][name] = values[ok]
    return out


def judge(run: Path, queue: FrontEndQueue, output_ms: float) -> list[dict[str, Any]]:
    req = pd.read_csv(run / "request_metrics.csv")
    schedule = pd.read_csv(run / "engine_schedule.csv")
    ids = {str(r): i for i, r in enumerate(req["request_id"])}
    # the run's request ids as positions, as request_delays_s reads a simulated schedule
    schedule = schedule.assign(
        requests=[
            " ".join(
                f"{ids[rid]}:{n}"
                for rid, n in (item.rsplit(":", 1) for item in str(text or "").split())
                if rid in ids
            )
            for text in schedule["requests"]
        ]
    )
    first, last = request_delays_s(
        queue,
        schedule,
        req["num_prefill_tokens"].to_numpy(),
        req["arrival_time_s"].to_numpy(dtype=float),
    )
    constant = np.full(len(req), output_ms / 1e3)
    by_model = {
        "queue": _client_times(run, first, last),
        "constant": _client_times(run, constant, constant),
    }
    rows = []
    for metric in METRICS:
        real = by_model["queue"][metric]["real"]
        for q in STATS:
            row: dict[str, Any] = {
                "run": run.name,
                "metric": metric,
                "stat": f"p{q}",
                "real_ms": float(np.nanpercentile(real, q) * 1e3),
            }
            for name, times in by_model.items():
                value = float(np.nanpercentile(times[metric]["model"], q) * 1e3)
                row[f"{name}_ms"] = value
                row[f"{name}_error"] = value / row["real_ms"] - 1
            rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("campaign", type=Path)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    meta = _bundle_meta(args.campaign)
    frontend = next(iter(meta["engine_calibration"].values()))["frontend"]
    queue = FrontEndQueue.from_calibration(frontend["queue"], "frontend.queue")
    runs = sorted(
        p
        for p in (args.campaign / "runs" / "real_bench").iterdir()
        if (p / "engine_schedule.csv").is_file() and "capacity" not in p.name
    )
    rows = [row for run in runs for row in judge(run, queue, float(frontend["output_ms"]))]
    print(f"queue {queue.to_dict()}, constant output_ms {frontend['output_ms']}")
    print(f"{'run':<22}{'metric':<6}{'stat':<5}{'real':>9}{'queue':>9}{'err':>8}"
          f"{'const':>9}{'err':>8}")  # fmt: skip
    for r in rows:
        print(
            f"{r['run']:<22}{r['metric']:<6}{r['stat']:<5}{r['real_ms']:>9.2f}"
            f"{r['queue_ms']:>9.2f}{r['queue_error']:>+8.1%}{r['constant_ms']:>9.2f}"
            f"{r['constant_error']:>+8.1%}"
        )
    summary = {}
    for name in ("queue", "constant"):
        errors = [r[f"{name}_error"] for r in rows]
        summary[name] = {
            "rows": len(errors),
            "mean_signed_pct": round(100 * statistics.fmean(errors), 2),
            "median_abs_pct": round(100 * statistics.median(abs(e) for e in errors), 2),
            "largest_abs_pct": round(100 * max(abs(e) for e in errors), 2),
        }
        s = summary[name]
        print(
            f"{name:<9} mean signed {s['mean_signed_pct']:+.1f}%  median abs "
            f"{s['median_abs_pct']:.1f}%  largest {s['largest_abs_pct']:.1f}% over {s['rows']} rows"
        )
    if args.out is not None:
        args.out.write_text(
            json.dumps(
                {"campaign": str(args.campaign), "queue": queue.to_dict(),
                 "output_ms": frontend["output_ms"], "summary": summary, "rows": rows},
                indent=2,
            )
            + "\n"
        )  # fmt: skip


if __name__ == "__main__":
    main()
