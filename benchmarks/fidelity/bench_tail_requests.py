"""Which requests make the main job's client TTFT tail, and which part of them the simulation
misses (issue 64).

Per request of each run (real against simulated, the parts of
:mod:`benchmarks.fidelity.bench_ttft_parts`), grouped by the time since the client's previous
send (:data:`SPACING_MS`): how many, their client TTFT and its parts (front end, held for a step,
queued, to the first token) real and simulated, the mean difference. Then the tail: the requests
at or over each run's real client TTFT p90, how many of them the client sent within
:data:`CLOSE_MS` of the previous send, their mean client TTFT real and simulated.

And the steps: each real step matched to the simulated step of the same requests with the same
tokens (the k-th occurrence of that composition on both sides), the real time less the
simulated one (ms, median and mean), by kind: prompt or decode, busy or after an idle, after a
step that first scheduled a request or not, and whether a client send fell in the step (real /
simulated). A one-signed difference where the step model's terms say nothing is a model gap.

Run: ``python -m benchmarks.fidelity.bench_tail_requests RUN [RUN ...] [--variant NAME]
[--root tmp] [--out F.json]``, each RUN a pipeline run id (its real and simulated runs read from
its ``run_meta.json``) or ``REAL_DIR:SIM_DIR``; with ``--variant``, each run's simulation by
``bench_sim_variants`` under that name instead (``tmp/vidur_simulate/variant-<NAME>-<RUN>``,
e.g. another ``vidur.seed``: a one-signed gap of one seed may be that seed's draws).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from benchmarks.fidelity.bench_ttft_parts import PARTS, real_parts, run_dirs, sim_parts

SPACING_MS: tuple[float, ...] = (0.0, 2.0, 10.0, 50.0, 150.0, 400.0, np.inf)
"""Bands of time since the client's previous send (ms); the first request counts as the last
band."""
CLOSE_MS = 10.0
"""A send this soon after the previous one came while that one was still on its way in or in
its prompt's step."""
BACK_TO_BACK_S = 0.002
"""A step starting this soon after the previous one ended: the engine stayed busy."""


def spacing_ms(real_dir: Path) -> pd.Series:
    """Per request: ms since the client's previous send (inf for the first)."""
    r = pd.read_csv(real_dir / "request_metrics.csv").set_index("request_id")
    sent = r["arrival_time_s"].sort_values()
    gap = 1000.0 * sent.diff().fillna(np.inf)
    return gap.reindex(r.index.sort_values())


def dirs_of(spec: str, root: Path, variant: str | None) -> tuple[Path, Path]:
    """(real, simulated) run directories of a run, the simulation ``variant``'s if named."""
    real_dir, sim_dir = run_dirs(spec, root)
    if variant is not None:
        sim_dir = root / "vidur_simulate" / f"variant-{variant}-{spec}"
    return real_dir, sim_dir


def requests_of(spec: str, root: Path, variant: str | None = None) -> pd.DataFrame:
    """One run's requests: real and simulated parts side by side, with the send spacing."""
    real_dir, sim_dir = dirs_of(spec, root, variant)
    real, sim = real_parts(real_dir), sim_parts(sim_dir)
    ids = real.index.intersection(sim.index)
    out = real.loc[ids].add_suffix("_real").join(sim.loc[ids].add_suffix("_sim"))
    out["spacing_ms"] = spacing_ms(real_dir).reindex(ids)
    out["run"] = spec
    return out


def by_spacing(table: pd.DataFrame) -> list[dict[str, Any]]:
    band = pd.cut(table["spacing_ms"], list(SPACING_MS), right=True)
    rows = []
    for interval, group in table.groupby(band, observed=True):
        row: dict[str, Any] = {"spacing_ms": f"{interval.left:g}–{interval.right:g}"}
        row["requests"] = len(group)
        for part in PARTS:
            row[f"{part}_real_ms"] = round(float(group[f"{part}_real"].mean()), 2)
            row[f"{part}_sim_ms"] = round(float(group[f"{part}_sim"].mean()), 2)
        per_run = group.groupby("run")[["ttft_real", "ttft_sim"]].mean()
        row["runs_sim_shorter"] = (
            f"{int((per_run['ttft_sim'] < per_run['ttft_real']).sum())} of {len(per_run)}"
        )
        rows.append(row)
    return rows


def tail(table: pd.DataFrame, side: str) -> dict[str, Any]:
    """The requests at or over their run's client TTFT p90 on one ``side`` (real or sim):
    selected on one side, a request's other side regresses towards the middle, so both
    selections are given."""
    cut = table.groupby("run")[f"ttft_{side}"].transform(lambda v: np.percentile(v, 90))
    top = table[table[f"ttft_{side}"] >= cut]
    close = top["spacing_ms"] <= CLOSE_MS
    return {
        "selected_on": side,
        "requests": len(top),
        f"sent within {CLOSE_MS:g} ms of the previous": int(close.sum()),
        "ttft_real_ms": round(float(top["ttft_real"].mean()), 2),
        "ttft_sim_ms": round(float(top["ttft_sim"].mean()), 2),
    }


def steps_of(run_dir: Path, sends: np.ndarray) -> pd.DataFrame:
    """A run's steps keyed by composition and occurrence, with their kind."""
    t = pd.read_csv(run_dir / "engine_schedule.csv").sort_values("start_time_s")
    t = t.reset_index(drop=True)
    t["occurrence"] = t.groupby("requests").cumcount()
    start, end = t["start_time_s"].to_numpy(), t["end_time_s"].to_numpy()
    pause = np.r_[np.inf, start[1:] - end[:-1]]
    t["busy"] = pause < BACK_TO_BACK_S
    t["after_prompt"] = t["num_prefill_requests"].shift(1).fillna(0) > 0
    t["sent"] = (np.searchsorted(sends, end) - np.searchsorted(sends, start)) > 0
    t["ms"] = 1000.0 * (end - start)
    return t


def matched_steps(spec: str, root: Path, variant: str | None = None) -> pd.DataFrame:
    real_dir, sim_dir = dirs_of(spec, root, variant)
    sends = np.sort(pd.read_csv(real_dir / "request_metrics.csv")["arrival_time_s"].to_numpy())
    real, sim = steps_of(real_dir, sends), steps_of(sim_dir, sends)
    both = real.merge(sim, on=["requests", "occurrence"], suffixes=("_real", "_sim"))
    kind = np.where(both["num_prefill_requests_real"] > 0, "prompt", "decode")
    kind = kind + np.where(both["busy_real"], ", busy", ", after idle")
    kind = kind + np.where(both["after_prompt_real"], ", after a prompt's step", "")
    real_sent = np.where(both["sent_real"], "yes", "no")
    sent = real_sent + " / " + np.where(both["sent_sim"], "yes", "no")
    return pd.DataFrame(
        {
            "kind": kind,
            "send real / sim": sent,
            "real_ms": both["ms_real"],
            "sim_ms": both["ms_sim"],
            "difference_ms": both["ms_real"] - both["ms_sim"],
        }
    )


def step_rows(steps: pd.DataFrame) -> list[dict[str, Any]]:
    rows = []
    for (kind, sent), group in steps.groupby(["kind", "send real / sim"]):
        rows.append(
            {
                "kind": kind,
                "send real / sim": sent,
                "steps": len(group),
                "real_median_ms": round(float(group["real_ms"].median()), 2),
                "sim_median_ms": round(float(group["sim_ms"].median()), 2),
                "real_less_sim_median_ms": round(float(group["difference_ms"].median()), 2),
                "real_less_sim_mean_ms": round(float(group["difference_ms"].mean()), 2),
            }
        )
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(none)"
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + " --- |" * len(keys)]
    lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def run_args(doc: str, argv: list[str] | None, variant: bool = True) -> argparse.Namespace:
    """The stored-runs benchmarks' arguments (this one's, ``bench_step_misses``' and
    ``bench_busy_hops``'): pipeline run ids, ``--variant`` (a ``bench_sim_variants`` variant's
    simulation; with ``variant``), ``--root``, ``--out``; the description is ``doc``'s first
    paragraph."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("runs", nargs="+")
    if variant:
        parser.add_argument("--variant", default=None)
    parser.add_argument("--root", type=Path, default=Path("tmp"))
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = run_args(__doc__, argv)
    table = pd.concat([requests_of(r, args.root, args.variant) for r in args.runs])
    steps = pd.concat(
        [matched_steps(r, args.root, args.variant) for r in args.runs], ignore_index=True
    )
    spacing, step_table = by_spacing(table), step_rows(steps)
    top = [tail(table, "real"), tail(table, "sim")]
    print(f"{len(args.runs)} runs, {len(table)} requests; by time since the previous send (ms),")
    print("each part's mean real / simulated (ms):\n")
    print(markdown(spacing))
    close = float((table["spacing_ms"] <= CLOSE_MS).mean())
    print(f"\nthe tail, at or over each run's client TTFT p90 (of all requests, {close:.1%} sent")
    print(f"within {CLOSE_MS:g} ms of the previous send):\n")
    print(markdown(top) + "\n")
    print("steps of the same requests and tokens, real less simulated (ms):\n")
    print(markdown(step_table))
    if args.out is not None:
        result = {
            "runs": args.runs,
            "variant": args.variant,
            "by_spacing": spacing,
            "tail": top,
            "steps": step_table,
        }
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
