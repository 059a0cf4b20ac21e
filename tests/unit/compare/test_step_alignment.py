"""compare's step-by-step alignment: the fraction over the longer sequence, and the first
divergence explained from its requests."""

from __future__ import annotations

import pandas as pd

from gpu_simulate_test.compare.alignment import align, alignment_markdown


def schedule(rows: list[tuple[float, str, int]]) -> pd.DataFrame:
    """Steps of (start, "id:tokens ...", preempted); requests with one token are generation."""
    out = []
    for start, requests, preempted in rows:
        items = [(rid, int(tok)) for rid, tok in (x.split(":") for x in requests.split())]
        pre = [tok for _, tok in items if tok > 1]
        dec = [tok for _, tok in items if tok == 1]
        out.append(
            {
                "start_time_s": start,
                "end_time_s": start + 0.004,
                "num_prefill_requests": len(pre),
                "num_prefill_tokens": sum(pre),
                "num_decode_requests": len(dec),
                "num_decode_tokens": sum(dec),
                "num_preempted": preempted,
                "requests": requests,
            }
        )
    return pd.DataFrame(out)


def test_identical_sequences_align_fully() -> None:
    steps = schedule([(0.0, "0:40", 0), (0.005, "0:1", 0)])
    result = align(steps, steps.copy())
    assert result.same_composition_fraction == 1.0 and result.first_divergence is None
    assert result.source == "engine_schedule" and result.preemptions == {"real": 0, "sim": 0}


def test_the_first_divergence_names_the_request_and_the_step_clock() -> None:
    real = schedule([(0.0, "0:40", 0), (0.005, "0:1 1:20", 0), (0.010, "0:1 1:1", 0)])
    # the simulated step 1 was scheduled before request 1 reached the engine
    sim = schedule([(0.0, "0:40", 0), (0.0045, "0:1", 0), (0.009, "0:1 1:20", 0)])
    sim = pd.concat([sim, schedule([(0.014, "0:1 1:1", 0)])], ignore_index=True)
    result = align(real, sim, {"0": 0.0, "1": 0.0048})
    assert result.same_composition_fraction == 1 / 4  # over the longer sequence
    first = result.first_divergence
    assert first is not None and first["step"] == 1
    assert "request 1: in the real step only" in first["why"]
    assert "the step clocks differ, not the scheduler" in first["why"]
    # queued 0.2 ms after the simulated step 1 started: "after", not "-0.200 ms before"
    assert (
        "0.200 ms before the real step was scheduled, 0.300 ms after the simulated" in first["why"]
    )
    text = alignment_markdown(result, None, None)
    assert "25.0%" in text and "First divergence at step 1" in text


def test_a_request_in_the_simulated_step_before_the_real_engine_had_it_is_the_way_in() -> None:
    # the real engine queued request 1 after both steps 1 started, yet the simulated step 1 holds
    # it: the simulated engine had it earlier (a shorter way in), not a scheduler difference
    real = schedule([(0.0, "0:40", 0), (0.005, "0:1", 0), (0.010, "0:1 1:20", 0)])
    sim = schedule([(0.0, "0:40", 0), (0.0045, "0:1 1:20", 0), (0.009, "0:1 1:1", 0)])
    result = align(real, sim, {"0": 0.0, "1": 0.0052})
    why = result.first_divergence["why"]  # type: ignore[index]
    assert "request 1: in the simulated step only" in why
    assert "0.200 ms after the real step was scheduled, 0.700 ms after the simulated one" in why
    assert "the simulated way in is shorter than the real one" in why and "-0." not in why


def test_a_preemption_on_one_side_is_said() -> None:
    real = schedule([(0.0, "0:40 1:40", 0), (0.005, "0:1", 1)])
    sim = schedule([(0.0, "0:40 1:40", 0), (0.005, "0:1 1:1", 0)])
    result = align(real, sim)
    assert "the real engine preempted 1 here" in result.first_divergence["why"]  # type: ignore[index]
    assert result.preemptions == {"real": 1, "sim": 0}


def test_step_logs_without_requests_align_on_compositions_only() -> None:
    real = schedule([(0.0, "0:40", 0), (0.005, "0:1", 0)]).drop(columns=["requests"])
    sim = real.iloc[:1].copy()
    result = align(real, sim)
    assert result.source == "engine_step_log" and result.same_composition_fraction == 0.5
    assert "ended after 1 steps" in result.first_divergence["why"]  # type: ignore[index]
