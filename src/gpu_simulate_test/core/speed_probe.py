"""The host's speed, read the same way at the calibration and before every real run.

On a shared host the engine's step time moves by tens of percent within minutes (10-35% between a
calibration and a real run on the project's 2-core machine), and a simulation timed by the
calibration then misses the real run by as much, in step time, not in scheduling. This probe
reads that speed at both ends: a few single requests of fixed lengths, one after another on an
idle engine, outside any measurement (``backend.warmup``), timed at the client. The calibration
records it in the bundle (meta.json ``engine_calibration.<backend>.speed_probe``), every real run
in its ``run_meta.json`` (``speed_probe``), and ``compare`` sets one against the other
(``host_speed``): how much slower or faster the host ran the real run than the calibration.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from gpu_simulate_test.core.engines.records import BenchRequest

PROMPT_TOKENS = 32
OUTPUT_TOKENS = 48
REPEATS = 3
FIRST_ID = -10_000_000
"""Probe request ids count down from here (apart from the warm-ups' and any workload's)."""
SEED = 0
"""The prompts' seed: every probe sends the same tokens."""
DRIFT_NOTE = 0.10
"""A host-speed change beyond this between the calibration and a real run is named in the
comparison's findings."""


def probe_requests(vocab_size: int) -> list[BenchRequest]:
    """The probe's requests: :data:`REPEATS` of :data:`PROMPT_TOKENS` prompt tokens and
    :data:`OUTPUT_TOKENS` output tokens, the same prompt each time."""
    rng = np.random.default_rng(SEED)
    prompt = tuple(int(t) for t in rng.integers(0, min(vocab_size, 151643), PROMPT_TOKENS))
    return [
        BenchRequest(
            request_id=FIRST_ID - i,
            num_prefill_tokens=PROMPT_TOKENS,
            num_decode_tokens=OUTPUT_TOKENS,
            scheduled_arrival_s=0.0,
            prompt_token_ids=prompt,
        )
        for i in range(REPEATS)
    ]


def measure(backend: Any, vocab_size: int) -> dict[str, Any]:
    """Serve the probe's requests one at a time on ``backend`` (outside any recorder) and time
    each at the client; ``ms_per_token`` is the median request's time over its output tokens."""
    samples = []
    for request in probe_requests(vocab_size):
        started = time.perf_counter()
        backend.warmup([request])
        samples.append((time.perf_counter() - started) * 1e3)
    return {
        "ms_per_token": round(float(np.median(samples)) / OUTPUT_TOKENS, 4),
        "request_ms": [round(s, 3) for s in samples],
        "prompt_tokens": PROMPT_TOKENS,
        "output_tokens": OUTPUT_TOKENS,
    }


def drift(truth: Mapping[str, Any] | None, calibration: Mapping[str, Any] | None) -> float | None:
    """The real run's probe over the calibration's, minus 1 (positive: the host ran the real
    run slower); None where either is missing."""
    if not truth or not calibration:
        return None
    slow, base = truth.get("ms_per_token"), calibration.get("ms_per_token")
    if not slow or not base:
        return None
    return float(slow) / float(base) - 1.0


def host_speed(
    calibration: Mapping[str, Any] | None,
    truth: Mapping[str, Any] | None,
    repeat: Mapping[str, Any] | None = None,
) -> dict[str, Any] | None:
    """``comparison.json`` ``host_speed``: both probes and the drift between them (and the
    repeated real run's); None without the calibration's probe and the real run's."""
    moved = drift(truth, calibration)
    if moved is None:
        return None
    assert calibration is not None and truth is not None
    out: dict[str, Any] = {
        "calibration_ms_per_token": calibration["ms_per_token"],
        "real_ms_per_token": truth["ms_per_token"],
        "drift": round(moved, 4),
    }
    again = drift(repeat, calibration)
    if again is not None:
        assert repeat is not None
        out["repeat_ms_per_token"] = repeat["ms_per_token"]
        out["repeat_drift"] = round(again, 4)
    return out


def finding(speed: Mapping[str, Any] | None) -> str | None:
    """The findings line, where the host's speed moved more than :data:`DRIFT_NOTE`."""
    if not speed or abs(speed["drift"]) <= DRIFT_NOTE:
        return None
    way = "slower" if speed["drift"] > 0 else "faster"
    return (
        f"host speed: the real run's probe ran {abs(speed['drift']):.0%} {way} than the "
        f"calibration's ({speed['real_ms_per_token']:.2f} vs "
        f"{speed['calibration_ms_per_token']:.2f} ms per token, one request at a time): the "
        "simulation's step times are the calibration's, so expect its errors to lean "
        f"{'fast' if speed['drift'] > 0 else 'slow'} by about as much"
    )


def line(speed: Mapping[str, Any] | None) -> str:
    """The console's line: the probe's drift, for every comparison that has it."""
    if not speed:
        return ""
    text = f"host speed since the calibration: {speed['drift']:+.1%} per token"
    if "repeat_drift" in speed:
        text += f" (repeat {speed['repeat_drift']:+.1%})"
    return text
