"""The busy sends' way in, its spread fitted through the steps (calibration version 19; a
working engine's stamps read as drains, version 20)."""

from __future__ import annotations

import numpy as np
import pytest

from gpu_simulate_test.calibration import busy_hop
from gpu_simulate_test.calibration.frontend import HELD_BACK_S
from gpu_simulate_test.calibration.input_spread import SPREAD_LEVELS
from gpu_simulate_test.calibration.input_steps import queued_at
from gpu_simulate_test.calibration.overhead import FrontEnd


def back_to_back(seconds: float, seed: int = 0) -> np.ndarray:
    """Steps of 7-9 ms, one after another, as (start, end) rows."""
    rng = np.random.default_rng(seed)
    lengths = rng.uniform(0.007, 0.009, int(seconds / 0.007))
    ends = np.cumsum(lengths)
    return np.c_[ends - lengths, ends]


def sent_through(spans: np.ndarray, hops_s: np.ndarray, seed: int = 1) -> tuple[np.ndarray, ...]:
    """Sends spread over the steps, queued where a hop of ``hops_s`` lands them."""
    rng = np.random.default_rng(seed)
    sent = np.sort(rng.uniform(0.1, spans[-1, 1] - 1.0, len(hops_s)))
    return sent, queued_at(sent + hops_s, spans)


def test_windows_follow_the_engine_stamps() -> None:
    spans = np.array([[0.0, 0.008], [0.008, 0.016]])
    sent = np.array([0.001, 0.002, 0.020, 0.003])
    # held for step 0; missed it; idle: exact; stamped 0.3 ms after step 1's end: it may have
    # arrived in that moment, so the window reaches its stamp, not the step's end
    queued = np.array([0.008, 0.016, 0.023, 0.0163])
    low, high = busy_hop.hop_windows_ms(sent, queued, spans, HELD_BACK_S)
    assert low == pytest.approx([0.0, 6.0, 3.0, 5.0])
    assert high == pytest.approx([7.0, 14.0, 3.0, 13.3])


def drained_through(
    spans: np.ndarray, hops_s: np.ndarray, seed: int = 7
) -> tuple[np.ndarray, np.ndarray]:
    """As vLLM's busy loop stamps them with work in hand: every request that reached the
    input before a drain (0.1 ms after a step's end) queued there, one after another 1 ms
    apart (each intake costs the loop that much), the next step starting after the last."""
    rng = np.random.default_rng(seed)
    sent = np.sort(rng.uniform(0.1, spans[-1, 1] - 1.0, len(hops_s)))
    drains = spans[:, 1] + 1e-4
    k = np.searchsorted(drains, sent + hops_s, side="left")
    queued = drains[k].copy()
    for step in np.unique(k):
        mine = np.flatnonzero(k == step)
        queued[mine] += 1e-3 * np.arange(len(mine))
    return sent, queued


def test_a_working_engines_late_stamps_are_drains_not_arrivals() -> None:
    spans = np.array([[0.0, 0.008], [0.009, 0.017]])
    sent = np.array([0.001, 0.002])
    # two requests drained after step 0, the second stamped 1.1 ms after its end (behind the
    # first's intake): with work in hand that is the drain, its hop anywhere up to its stamp
    queued = np.array([0.0081, 0.0091])
    low, high = busy_hop.hop_windows_ms(sent, queued, spans, HELD_BACK_S)
    assert low[1] == pytest.approx(high[1]) == pytest.approx(7.1)  # read as an arrival
    low, high = busy_hop.hop_windows_ms(sent, queued, spans, HELD_BACK_S, np.array([True, True]))
    assert low == pytest.approx([0.0, 0.0]) and high == pytest.approx([7.1, 7.1])
    # an engine with nothing else to do waits for input: its stamp is the arrival
    low, high = busy_hop.hop_windows_ms(sent, queued, spans, HELD_BACK_S, np.array([True, False]))
    assert low[1] == pytest.approx(high[1]) == pytest.approx(7.1)
    done = np.array([0.030, 0.031])  # each still running at the other's stamp
    assert busy_hop.engine_working(queued, done).tolist() == [False, True]
    assert busy_hop.engine_working(queued, np.array([0.0085, 0.031])).tolist() == [False, False]


def test_a_constant_hop_through_drains_reads_narrow_only_with_them() -> None:
    """A 3 ms hop for every busy send, stamped where a working engine drains its input (the
    second of a drain 1 ms after the first): read as arrivals, the late stamps make a tail
    that is not there; read as drains, the spread stays on the line."""
    spans = back_to_back(20.0, seed=8)
    n = 1500
    hops = np.full(n, 3.0e-3)
    sent, queued = drained_through(spans, hops)
    late = queued - spans[np.searchsorted(spans[:, 1], queued) - 1, 1] > HELD_BACK_S
    assert late.mean() > 0.03  # enough second-in-a-drain stamps to matter
    line = {"input_ms": 3.0, "input_per_running_ms": 0.0}
    done = queued + 1.0  # every request still running at every other's stamp
    as_arrivals = busy_hop.busy_hop_spread(sent, queued, np.ones(n), spans, line, HELD_BACK_S)
    as_drains = busy_hop.busy_hop_spread(
        sent, queued, np.ones(n), spans, line, HELD_BACK_S, done_s=done
    )
    p95 = SPREAD_LEVELS.index(0.95)
    assert as_arrivals[busy_hop.KEY]["1"][-1] > 3.0  # a phantom tail
    assert abs(as_drains[busy_hop.KEY]["1"][p95]) < 0.5
    assert as_drains[busy_hop.KEY]["1"][-1] < as_arrivals[busy_hop.KEY]["1"][-1] - 2.0


def test_a_known_spread_is_read_back_through_the_steps() -> None:
    """Hops of 2.3 ms plus a long tail for a fifth of them, seen only through 7-9 ms steps: the
    spread read back puts the tail where it was (the line: 2.5 ms, so residuals around it)."""
    spans = back_to_back(30.0)
    rng = np.random.default_rng(2)
    n = 1200
    tail = rng.random(n) < 0.2
    hops = 2.3e-3 + np.where(tail, rng.exponential(2e-3, n), rng.uniform(0, 0.6e-3, n))
    sent, queued = sent_through(spans, hops)
    line = {"input_ms": 2.5, "input_per_running_ms": 0.0}
    out = busy_hop.busy_hop_spread(sent, queued, np.ones(n), spans, line, HELD_BACK_S)
    assert out[busy_hop.COUNT_KEY] == n
    read = np.array(out[busy_hop.KEY]["1"]) + 2.5
    true = np.quantile(1e3 * hops, SPREAD_LEVELS)
    at = {level: k for k, level in enumerate(SPREAD_LEVELS)}
    assert read[at[0.5]] == pytest.approx(true[at[0.5]], abs=0.3)
    assert read[at[0.95]] == pytest.approx(true[at[0.95]], abs=1.0)
    assert read[at[0.95]] > read[at[0.5]] + 2.0  # the tail is there, not the window's middles
    assert np.all(np.diff(read) >= 0)


def test_a_constant_hop_reads_narrow() -> None:
    spans = back_to_back(20.0, seed=3)
    hops = np.full(600, 3.0e-3)
    sent, queued = sent_through(spans, hops, seed=4)
    line = {"input_ms": 3.0, "input_per_running_ms": 0.0}
    out = busy_hop.busy_hop_spread(sent, queued, np.full(600, 2), spans, line, HELD_BACK_S)
    assert list(out[busy_hop.KEY]) == ["2"]  # every send with two running: that bucket alone
    residual = np.array(out[busy_hop.KEY]["2"])
    assert np.abs(residual[1:-1]).max() < 0.5


def test_idle_sends_and_too_few_busy_ones_give_none() -> None:
    spans = back_to_back(5.0)
    hops = np.full(100, 2.0e-3)
    sent, queued = sent_through(spans, hops)
    line = {"input_ms": 2.0}
    running = np.zeros(100)
    assert busy_hop.busy_hop_spread(sent, queued, running, spans, line, HELD_BACK_S) == {}
    running[: busy_hop.MIN_BUSY_HOPS - 1] = 1
    assert busy_hop.busy_hop_spread(sent, queued, running, spans, line, HELD_BACK_S) == {}


def test_the_front_end_reads_it_back_and_names_a_bad_one() -> None:
    spread = [round(-1.0 + 0.2 * k, 2) for k in range(len(SPREAD_LEVELS))]
    recorded = {"input_ms": 2.5, "output_ms": 1.0, busy_hop.KEY: {"1": spread}}
    front = FrontEnd.from_calibration(recorded, "meta.json engine_calibration.vllm.frontend")
    assert front.busy_hop_residual_ms == ((1, tuple(spread)),)
    assert front.moves_with_load
    recorded[busy_hop.KEY] = {"1": spread[::-1]}
    with pytest.raises(ValueError, match=r"frontend\.busy_hop_residual_ms\.1: expected increasing"):
        FrontEnd.from_calibration(recorded, "meta.json engine_calibration.vllm.frontend")


def test_buckets_merge_upward_until_each_holds_enough_sends() -> None:
    running = np.array([1] * 30 + [2] * 25 + [3] * 10 + [5] * 60 + [9] * 10 + [20] * 5 + [40] * 3)
    merged = [
        (b, sorted(set(running[m].tolist()))) for b, m in busy_hop.merged_buckets(running, 50)
    ]
    assert merged == [(1, [1, 2, 3]), (4, [5, 9, 20, 40])]  # 8 and up too few: into the one below
    few = np.array([6] * 20 + [1] * 5)
    assert [(b, int(m.sum())) for b, m in busy_hop.merged_buckets(few, 50)] == [(1, 25)]
    high = np.array([9] * 60 + [40] * 70)
    assert [(b, int(m.sum())) for b, m in busy_hop.merged_buckets(high, 50)] == [(8, 60), (32, 70)]


def test_a_busier_bucket_keeps_its_own_longer_hops() -> None:
    """Hops of 2.3 ms with one running, 5 ms with eight: each bucket reads its own."""
    spans = back_to_back(40.0, seed=5)
    n = 1000
    running = np.where(np.arange(n) % 2 == 0, 1, 8)
    hops = np.where(running == 1, 2.3e-3, 5.0e-3)
    sent, queued = sent_through(spans, hops, seed=6)
    line = {"input_ms": 2.0, "input_per_running_ms": 0.0}
    out = busy_hop.busy_hop_spread(sent, queued, running, spans, line, HELD_BACK_S)
    spread = out[busy_hop.KEY]
    assert sorted(spread) == ["1", "8"]
    median = SPREAD_LEVELS.index(0.5)
    assert spread["1"][median] + 2.0 == pytest.approx(2.3, abs=0.4)
    assert spread["8"][median] + 2.0 == pytest.approx(5.0, abs=0.6)
