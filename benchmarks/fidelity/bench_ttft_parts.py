"""Where a first token's time goes, real against simulated, request by request (issue 46).

A client's TTFT is the sum of four parts, each read the same way on both sides:

- **front end**: the request's hop to the engine core (send → queued, less any wait for a step
  in progress) plus its first token's way back (the engine's first token → the client);
- **held**: the wait for a step that was running when the request reached the engine core
  (vLLM takes new requests only between steps, and stamps them queued when it does);
- **queued**: queued → first scheduled (the engine's own stamps; the simulation's
  ``engine_scheduling_delay_s``);
- **to first token**: first scheduled → the engine's first token (the prompt's step or steps,
  and for an idle engine its wake-up).

Real: the real bench's ``request_metrics`` (engine stamps) and ``engine_schedule`` (the steps,
for the held part, as :func:`gpu_simulate_test.calibration.frontend.hop_s` reads it). Simulated:
``frontend_delay_s`` (input, held and the way back), ``scheduling_delay_s`` (held and queued),
``engine_scheduling_delay_s`` (queued) and ``ttft_s``. Per run and pooled: each part's mean and
median on both sides and the mean per-request difference (simulated − real), so a one-signed
part shows where the simulated first token comes early or late. Over every run's requests
together: each part's p50 / p90 / p99 real and simulated, and the same of the front end and
held part cut the other way (the way in, send → queued; the way back), where a short tail is.

Run: ``python -m benchmarks.fidelity.bench_ttft_parts RUN [RUN ...] [--root tmp] [--out F.json]``,
each RUN a pipeline run id (its real and simulated runs read from its ``run_meta.json``) or
``REAL_DIR:SIM_DIR``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.calibration.frontend import hop_s

PARTS: tuple[str, ...] = ("front_end", "held", "queued", "to_first_token", "ttft")
SIDES: tuple[str, ...] = ("way_in", "way_back")
"""The front end and the held part cut the other way, each well defined on both sides: the way in
(send → queued, the wait for a step in progress included: no estimate of when the request
reached the engine core) and the first token's way back (the engine's first token → the
client)."""
POOLED_QUANTILES: tuple[int, ...] = (50, 90, 99)


def run_dirs(spec: str, root: Path) -> tuple[Path, Path]:
    """(real, simulated) run directories of a pipeline run id or ``REAL:SIM``."""
    if ":" in spec:
        real, sim = spec.split(":", 1)
        return Path(real), Path(sim)
    meta = json.loads((root / "pipeline" / spec / "run_meta.json").read_text())
    stages = meta["stages"]
    return Path(stages["real_bench"]["path"]), Path(stages["vidur_simulate"]["path"])


def real_parts(real_dir: Path) -> pd.DataFrame:
    """Each real request's parts (ms) from the engine's stamps and recorded steps."""
    r = pd.read_csv(real_dir / "request_metrics.csv").set_index("request_id").sort_index()
    steps = pd.read_csv(real_dir / "engine_schedule.csv")
    spans = steps[["start_time_s", "end_time_s"]].to_numpy(dtype=float)
    sent = r["arrival_time_s"].to_numpy(dtype=float)
    queued_at = r["engine_arrival_time_s"].to_numpy(dtype=float)
    hop = np.array([hop_s(s, q, spans) for s, q in zip(sent, queued_at, strict=True)])
    back = r["ttft_s"] - (r["engine_first_token_time_s"] - r["arrival_time_s"])
    return 1000.0 * pd.DataFrame(
        {
            "front_end": hop + back.to_numpy(dtype=float),
            "held": queued_at - sent - hop,
            "queued": r["engine_scheduling_delay_s"].to_numpy(dtype=float),
            "to_first_token": (
                r["engine_first_token_time_s"] - r["engine_scheduled_time_s"]
            ).to_numpy(dtype=float),
            "ttft": r["ttft_s"].to_numpy(dtype=float),
            "way_in": queued_at - sent,
            "way_back": back.to_numpy(dtype=float),
        },
        index=r.index,
    )


def sim_parts(sim_dir: Path) -> pd.DataFrame:
    """Each simulated request's parts (ms), from the columns the simulation writes (the ways,
    :data:`SIDES`, where it writes ``frontend_first_token_s``)."""
    s = pd.read_csv(sim_dir / "request_metrics.csv").set_index("request_id").sort_index()
    queued = s["engine_scheduling_delay_s"]
    held = s["scheduling_delay_s"] - queued
    front = s["frontend_delay_s"] - held
    back = s.get("frontend_first_token_s")  # an older simulation: no ways
    ways = {} if back is None else {"way_in": s["frontend_delay_s"] - back, "way_back": back}
    return 1000.0 * pd.DataFrame(
        {
            "front_end": front,
            "held": held,
            "queued": queued,
            "to_first_token": s["ttft_s"] - s["frontend_delay_s"] - queued,
            "ttft": s["ttft_s"],
            **ways,
        }
    )


def summary(real: pd.DataFrame, sim: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Per part (and per way, :data:`SIDES`, where both sides have it) over the requests both
    sides have: the means, the medians and the mean per-request difference."""
    ids = real.index.intersection(sim.index)
    real, sim = real.loc[ids], sim.loc[ids]
    return {
        part: {
            "real_mean_ms": round(float(real[part].mean()), 3),
            "sim_mean_ms": round(float(sim[part].mean()), 3),
            "real_p50_ms": round(float(real[part].median()), 3),
            "sim_p50_ms": round(float(sim[part].median()), 3),
            "mean_difference_ms": round(float((sim[part] - real[part]).mean()), 3),
        }
        for part in (*PARTS, *SIDES)
        if part in real and part in sim
    }


def pooled_quantiles(
    pooled: list[tuple[pd.DataFrame, pd.DataFrame]],
) -> dict[str, dict[str, dict[str, float | None]]]:
    """Each part (and each way, :data:`SIDES`) over every run's requests together: real and
    simulated at :data:`POOLED_QUANTILES`, and simulated / real − 1: where a tail is short."""
    real = pd.concat([r.loc[r.index.intersection(s.index)] for r, s in pooled])
    sim = pd.concat([s.loc[r.index.intersection(s.index)] for r, s in pooled])
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    for part in (*PARTS, *SIDES):
        if part not in real or part not in sim:
            continue
        cells = {}
        for q in POOLED_QUANTILES:
            a, b = float(np.nanpercentile(real[part], q)), float(np.nanpercentile(sim[part], q))
            ratio = round(b / a - 1.0, 4) if a > 0 else None  # None: no ratio to a zero
            cells[f"p{q}"] = {"real_ms": round(a, 3), "sim_ms": round(b, 3), "sim_vs_real": ratio}
        out[part] = cells
    return out


def print_pooled(quantiles: dict[str, dict[str, dict[str, float | None]]], count: int) -> None:
    print(f"\npooled over {count} requests: real / simulated (ms), simulated / real − 1\n")
    heads = " | ".join(f"p{q}" for q in POOLED_QUANTILES)
    print(f"| part | {heads} |")
    print("| --- |" + " --- |" * len(POOLED_QUANTILES))
    for part, cells in quantiles.items():
        shown = " | ".join(
            f"{c['real_ms']:.2f} / {c['sim_ms']:.2f}"
            + ("" if c["sim_vs_real"] is None else f" ({c['sim_vs_real']:+.1%})")
            for c in cells.values()
        )
        print(f"| {part} | {shown} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--root", type=Path, default=Path("tmp"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    results: dict[str, Any] = {}
    pooled: list[tuple[pd.DataFrame, pd.DataFrame]] = []
    for spec in args.runs:
        real_dir, sim_dir = run_dirs(spec, args.root)
        real, sim = real_parts(real_dir), sim_parts(sim_dir)
        results[spec] = summary(real, sim)
        pooled.append((real, sim))
    if len(pooled) > 1:
        results["pooled"] = {
            part: {
                "mean_difference_ms": round(
                    float(np.mean([v[part]["mean_difference_ms"] for v in results.values()])), 3
                ),
                "real_mean_ms": round(
                    float(np.mean([v[part]["real_mean_ms"] for v in results.values()])), 3
                ),
            }
            for part in PARTS
        }
    print("| run | part | real mean | sim mean | real p50 | sim p50 | sim − real (mean, ms) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for spec, parts in results.items():
        for part, v in parts.items():
            cells = [v.get(k, float("nan")) for k in ("real_mean_ms", "sim_mean_ms")]
            cells += [v.get(k, float("nan")) for k in ("real_p50_ms", "sim_p50_ms")]
            shown = " | ".join(f"{c:.2f}" for c in cells)
            print(f"| {spec} | {part} | {shown} | {v['mean_difference_ms']:+.2f} |")
    if len(pooled) > 1:
        quantiles = pooled_quantiles(pooled)
        results["pooled_quantiles"] = quantiles
        print_pooled(quantiles, sum(len(r.index.intersection(s.index)) for r, s in pooled))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
