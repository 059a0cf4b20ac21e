"""Where in the engine's step a request sent to a busy engine arrives, real against simulated
(issue 64: the way in at 20–50% of capacity is long in the simulation).

A request sent while the engine runs waits for the step in progress: the engine core takes new
requests only between steps (vLLM V1's busy loop; on CPU vLLM turns async scheduling off). The
simulation reaches the engine ``input line`` after the send and holds the request to the end of
the simulated step it arrives in. Per stored campaign (``tmp/fidelity/<CAMPAIGN>``) and load,
over the requests sent to a busy engine (another in flight at the send, by the engine's own
stamps):

- the way in (send → the engine queued it), real and simulated (at the real run's step level),
  and the simulated one's parts: the line and the hold;
- the calibrated line through the **real** steps: each request reaching the engine the line after
  its send and held to the end of the real step it arrives in, against the engine's stamps (the
  line is fitted that way, :mod:`gpu_simulate_test.calibration.input_steps`);
- the step each request reaches the engine in (its send plus the line), its length and what is
  left of it, real and simulated;
- where in its step each send and each API-server arrival (``front_end_stamps.csv``) falls, in
  fifths of the step (a send independent of the steps falls in each fifth a fifth of the time);
- how much longer a decode-only step with one send in it runs than the median step of the same
  composition without a send, by how far into the step the send fell (``stretch``).

Run: ``python -m benchmarks.fidelity.bench_send_phase CAMPAIGN [CAMPAIGN ...]
[--sim CAMPAIGN=SIMULATED_CAMPAIGN ...] [--out F.json]``; ``--sim`` reads the simulation from
another folder of the same campaign's loads (a re-simulation, e.g. with today's default).
``--real RUN_DIR [RUN_DIR ...]`` reads real-bench runs alone (no simulation, no API server
stamps needed): the sends' place in the steps, the step at the send and what is left of it the
campaign p calibration's line after the send.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.calibration.input_steps import queued_at
from gpu_simulate_test.calibration.serving_replay import sends_within

FIFTHS = 5
INTO_STEP_MS = (0.0, 1.0, 2.0, 3.0, 5.0, float("inf"))
"""The bins of how far into its step a send fell (ms from the step's start), for the stretch."""
RANDOM_TIMES = 20_000
"""Random times the stretch is read at as well, in the steps without a send (its baseline)."""


def _spans(run: Path) -> np.ndarray:
    steps = pd.read_csv(run / "engine_schedule.csv")
    spans: np.ndarray = steps[["start_time_s", "end_time_s"]].to_numpy(dtype=float)
    return spans


def step_at(spans: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per time, the length of the step running then, what is left of it and how far into it
    (a fraction) the time is; NaN where no step runs."""
    k = np.clip(np.searchsorted(spans[:, 1], t, side="right"), 0, len(spans) - 1)
    inside = (t >= spans[k, 0]) & (t < spans[k, 1])
    length = spans[k, 1] - spans[k, 0]
    return (
        np.where(inside, length, np.nan),
        np.where(inside, spans[k, 1] - t, np.nan),
        np.where(inside, (t - spans[k, 0]) / length, np.nan),
    )


def fifths(phase: np.ndarray) -> list[float]:
    """The share of the known phases in each fifth of the step."""
    known = phase[~np.isnan(phase)]
    counts = np.histogram(known, bins=FIFTHS, range=(0.0, 1.0))[0]
    return [round(float(c) / max(1, len(known)), 3) for c in counts]


def stretch(run: Path) -> dict[str, Any]:
    """A real run's decode-only steps with exactly one send in them: per bin of how far into
    the step the send fell (:data:`INTO_STEP_MS`), their count and their median time beyond the
    median step of the same composition (prompt requests, prompt tokens in 16s, decodes) with
    no send (ms)."""
    steps = pd.read_csv(run / "engine_schedule.csv")
    start = steps["start_time_s"].to_numpy(dtype=float)
    end = steps["end_time_s"].to_numpy(dtype=float)
    length = (end - start) * 1e3
    sent = np.sort(pd.read_csv(run / "request_metrics.csv")["arrival_time_s"].to_numpy(float))
    count = sends_within(sent, start, end)
    key = pd.Series(
        [
            f"{a}:{b // 16}:{c}"
            for a, b, c in zip(
                steps["num_prefill_requests"], steps["num_prefill_tokens"],
                steps["num_decode_requests"], strict=True,
            )
        ]
    )  # fmt: skip
    quiet = count == 0
    base = pd.Series(length)[quiet].groupby(key[quiet]).median()
    beyond = length - key.map(base).to_numpy(dtype=float)
    k = np.clip(np.searchsorted(end, sent, side="right"), 0, len(end) - 1)
    one = (
        (sent >= start[k]) & (sent < end[k]) & (count[k] == 1)
        & (steps["num_prefill_requests"].to_numpy()[k] == 0) & ~np.isnan(beyond[k])
    )  # fmt: skip
    # the same read at random times in the steps without a send: a time far into a step falls
    # only in a long one, so a late send's step is long by selection alone
    times = np.sort(np.random.default_rng(0).uniform(start[0], end[-1], RANDOM_TIMES))
    j = np.clip(np.searchsorted(end, times, side="right"), 0, len(end) - 1)
    fake = (
        (times >= start[j]) & (times < end[j]) & quiet[j]
        & (steps["num_prefill_requests"].to_numpy()[j] == 0) & ~np.isnan(beyond[j])
    )  # fmt: skip

    def binned(into: np.ndarray, extra: np.ndarray) -> dict[str, dict[str, Any]]:
        bins = {}
        for lo, hi in itertools.pairwise(INTO_STEP_MS):
            inside = (into >= lo) & (into < hi)
            bins[f"{lo:g}-{hi:g}"] = {
                "steps": int(inside.sum()),
                "beyond_ms": round(float(np.median(extra[inside])), 3) if inside.any() else None,
            }
        return bins

    return {
        "by_ms_into_step": binned((sent - start[k])[one] * 1e3, beyond[k][one]),
        "random_times": binned((times - start[j])[fake] * 1e3, beyond[j][fake]),
    }


def line_of(campaign: Path) -> tuple[float, float]:
    """The campaign calibration's input line (ms, ms per running request)."""
    meta = next((campaign / "profiles").rglob("meta.json"))
    front = json.loads(meta.read_text())["engine_calibration"]["vllm"]["frontend"]
    return float(front["input_ms"]), float(front["input_per_running_ms"])


def one_load(real: Path, sim: Path, line: tuple[float, float]) -> dict[str, Any]:
    """One load's real run against its simulation at the real run's step level."""
    rows = pd.read_csv(real / "request_metrics.csv").sort_values("request_id")
    simulated = pd.read_csv(sim / "request_metrics.csv").sort_values("request_id")
    front = pd.read_csv(real / "front_end_stamps.csv").set_index("request_id")
    front_s = front.loc[rows["request_id"], "front_arrival_time_s"].to_numpy(dtype=float)
    sent = rows["arrival_time_s"].to_numpy(dtype=float)
    queued = rows["engine_arrival_time_s"].to_numpy(dtype=float)
    done = rows["engine_last_token_time_s"].to_numpy(dtype=float)
    running = np.array([np.sum((queued <= t) & (t < done)) for t in sent])
    busy = running > 0
    real_spans, sim_spans = _spans(real), _spans(sim)
    line_s = (line[0] + line[1] * running) / 1e3
    on_real = queued_at(sent + line_s, real_spans)
    sim_line = simulated["frontend_input_s"].to_numpy(dtype=float)
    sim_hold = simulated["held_back_s"].to_numpy(dtype=float)
    real_len, real_left, _ = step_at(real_spans, sent + sim_line)
    sim_len, sim_left, sim_phase = step_at(sim_spans, sent + sim_line)
    _, _, send_phase = step_at(real_spans, sent)
    _, _, front_phase = step_at(real_spans, front_s)
    b = busy

    def ms(values: np.ndarray) -> float:
        return round(1e3 * float(np.nanmean(values)), 3)

    return {
        "busy_sends": int(b.sum()),
        "way_in_ms": {"real": ms((queued - sent)[b]), "simulated": ms((sim_line + sim_hold)[b])},
        "simulated_parts_ms": {"line": ms(sim_line[b]), "hold": ms(sim_hold[b])},
        "line_on_real_steps_ms": ms((on_real - sent)[b]),
        "line_on_real_steps_error_ms": {
            "mean": ms((on_real - queued)[b]),
            "median": round(1e3 * float(np.median((on_real - queued)[b])), 3),
        },
        "step_at_reach_ms": {
            "real": {"length": ms(real_len[b]), "left": ms(real_left[b])},
            "simulated": {"length": ms(sim_len[b]), "left": ms(sim_left[b])},
        },
        "fifths": {
            "real_send": fifths(send_phase[b]),
            "real_api_server": fifths(front_phase[b]),
            "simulated_reach": fifths(sim_phase[b]),
        },
        "send_to_api_server_ms": ms((front_s - sent)[b]),
        "stretch": stretch(real),
    }


REAL_ONLY_LINE_MS = (1.88, 0.04)
"""``--real``: the line through which a busy send reaches the engine (campaign p's calibration,
2026-12-04)."""


def real_only(run: Path) -> dict[str, Any]:
    """One real-bench run alone: its busy sends' lateness, their fifths, the step at the send,
    what is left of the step the line after the send, the way in and the line through the
    steps."""
    rows = pd.read_csv(run / "request_metrics.csv").sort_values("request_id")
    spans = _spans(run)
    sent = rows["arrival_time_s"].to_numpy(dtype=float)
    late = sent - rows["scheduled_arrival_time_s"].to_numpy(dtype=float)
    queued = rows["engine_arrival_time_s"].to_numpy(dtype=float)
    done = rows["engine_last_token_time_s"].to_numpy(dtype=float)
    running = np.array([np.sum((queued <= t) & (t < done)) for t in sent])
    b = running > 0
    line_s = (REAL_ONLY_LINE_MS[0] + REAL_ONLY_LINE_MS[1] * running) / 1e3
    length, _, phase = step_at(spans, sent)
    reach_length, left, _ = step_at(spans, sent + line_s)
    on_steps = queued_at(sent + line_s, spans)
    return {
        "busy_sends": int(b.sum()),
        "late_ms": {
            "p50": round(1e3 * float(np.median(late)), 3),
            "p99": round(1e3 * float(np.percentile(late, 99)), 3),
        },
        "send_fifths": fifths(phase[b]),
        "step_at_send_ms": round(1e3 * float(np.nanmean(length[b])), 3),
        "left_at_reach_ms": round(1e3 * float(np.nanmean(left[b])), 3),
        "step_at_reach_ms": round(1e3 * float(np.nanmean(reach_length[b])), 3),
        "way_in_ms": round(1e3 * float(np.mean((queued - sent)[b])), 3),
        "line_on_steps_ms": round(1e3 * float(np.mean((on_steps - sent)[b])), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("campaigns", nargs="*")
    parser.add_argument("--sim", action="append", default=[], metavar="CAMPAIGN=SIMULATED")
    parser.add_argument("--real", nargs="+", type=Path, default=[], metavar="RUN_DIR")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.real:
        runs = {run.name: real_only(run) for run in args.real}
        for name, one in runs.items():
            print(f"{name}: {json.dumps(one)}", flush=True)
        if args.out:
            args.out.write_text(json.dumps(runs, indent=1) + "\n")
        return
    root = Path("tmp") / "fidelity"
    sims = dict(item.split("=", 1) for item in args.sim)
    doc: dict[str, Any] = {
        "date": dt.datetime.now().strftime("%Y%m%d-%H%M%S"),
        "command": "python -m benchmarks.fidelity.bench_send_phase "
        + " ".join([*args.campaigns, *(f"--sim {s}" for s in args.sim)]),
        "campaigns": {},
    }
    for name in args.campaigns:
        campaign = root / name
        simulated = root / sims.get(name, name)
        line = line_of(campaign)
        loads = {}
        for real in sorted((campaign / "runs" / "real_bench").glob("vllm-load[0-9]")):
            sim = simulated / "runs" / "vidur_simulate" / f"{real.name}-at-level"
            if not sim.is_dir():
                continue
            one = one_load(real, sim, line)
            loads[real.name] = one
            print(
                f"{name} {real.name}: busy sends {one['busy_sends']}, way in real "
                f"{one['way_in_ms']['real']:.2f} ms, simulated {one['way_in_ms']['simulated']:.2f} "
                f"(line {one['simulated_parts_ms']['line']:.2f} + hold "
                f"{one['simulated_parts_ms']['hold']:.2f}); the line through the real steps "
                f"{one['line_on_real_steps_ms']:.2f} (mean error "
                f"{one['line_on_real_steps_error_ms']['mean']:+.2f}); left of the step at the "
                f"reach: real {one['step_at_reach_ms']['real']['left']:.2f} of "
                f"{one['step_at_reach_ms']['real']['length']:.2f}, simulated "
                f"{one['step_at_reach_ms']['simulated']['left']:.2f} of "
                f"{one['step_at_reach_ms']['simulated']['length']:.2f}; fifths: sends "
                f"{one['fifths']['real_send']}, API server {one['fifths']['real_api_server']}; "
                "a decode step with one send, beyond its composition's median, by ms into the "
                "step: "
                + ", ".join(
                    f"{span} {cell['beyond_ms']:+.2f} ({cell['steps']})"
                    for span, cell in one["stretch"]["by_ms_into_step"].items()
                    if cell["beyond_ms"] is not None
                )
                + " (random times: "
                + ", ".join(
                    f"{span} {cell['beyond_ms']:+.2f}"
                    for span, cell in one["stretch"]["random_times"].items()
                    if cell["beyond_ms"] is not None
                )
                + ")",
                flush=True,
            )
        doc["campaigns"][name] = {"line_ms": list(line), "loads": loads}
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
