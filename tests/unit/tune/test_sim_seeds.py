"""``tune.sim_seeds``: each configuration searched under several noise seeds, the median seed's
result answering, every seed's capacity beside it (the table's range, ``tune.json``
``sim_seeds``)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gpu_simulate_test.capacity.search import Answer, Point
from gpu_simulate_test.config.backends import VllmBackendConfig
from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.config.tune import TuneOptions
from gpu_simulate_test.tune import simulate
from gpu_simulate_test.tune.rank import seed_range, seeds_record, table
from gpu_simulate_test.tune.report import seeds_sentence
from gpu_simulate_test.tune.simulate import Simulated, median_seed
from gpu_simulate_test.tune.space import candidates
from tests.vidur_bundle_factory import QWEN3_TINY

BACKEND = VllmBackendConfig(max_num_batched_tokens=128, max_num_seqs=8, num_gpu_blocks_override=256)


def _candidate(config_id: str = "s8") -> Any:
    found = candidates(TuneOptions(space={"max_num_seqs": [8]}), BACKEND, QWEN3_TINY, 80)
    return dataclasses.replace(found[0], config_id=config_id)


def _run(capacity: float | None, simulations: int = 4, config_id: str = "s8") -> Simulated:
    point = Point(capacity or 1.0, "bracket", {"ttft_p90": 50.0}, capacity is not None)
    answer = Answer(capacity, (capacity or 1.0, None), (point,))
    return Simulated(_candidate(config_id), answer, point, simulations=simulations)


def test_the_median_seed_answers_with_every_seed_beside_it() -> None:
    runs = [_run(150.0, 5), _run(130.0, 3), _run(170.0, 4)]
    chosen = median_seed(runs)
    assert chosen.answer is runs[0].answer and chosen.capacity == 150.0  # its own points
    assert chosen.seed_scores == (150.0, 130.0, 170.0)  # in seed order
    assert chosen.simulations == 12  # every seed's simulations counted
    # an even count: the lower middle one (the cautious answer); no rate met: -1, lowest
    chosen = median_seed([_run(150.0), _run(None), _run(120.0), _run(170.0)])
    assert chosen.capacity == 120.0 and chosen.seed_scores == (150.0, -1.0, 120.0, 170.0)


def test_each_later_seed_searches_from_the_first_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[float | None, bool, int]] = []
    capacities = {0: 100.0, 1: 90.0, 2: 120.0}

    def search(tuned: Any, candidate: Any, shared: Any, seed: Any, grid: bool, offset: int = 0):
        calls.append((seed, grid, offset))
        return _run(capacities[offset])

    monkeypatch.setattr(simulate, "one_search", search)
    tuned: Any = type("T", (), {"cfg": type("C", (), {"tune": TuneOptions(sim_seeds=3)})})
    chosen = simulate.one_configuration(tuned, _candidate(), None, None, True)
    assert calls == [(None, True, 0), (100.0, False, 1), (100.0, False, 2)]
    assert chosen.capacity == 100.0 and chosen.seed_scores == (100.0, 90.0, 120.0)
    # one seed: one search, nothing recorded; a first seed no rate serves is not searched again
    calls.clear()
    tuned.cfg.tune = TuneOptions(sim_seeds=1)
    assert simulate.one_configuration(tuned, _candidate(), None, 7.0, False).seed_scores == ()
    assert calls == [(7.0, False, 0)]
    calls.clear()
    capacities[0] = None  # type: ignore[assignment]
    tuned.cfg.tune = TuneOptions(sim_seeds=3)
    assert simulate.one_configuration(tuned, _candidate(), None, 7.0, False).seed_scores == ()
    assert len(calls) == 1


def test_the_table_and_the_record_carry_the_range() -> None:
    ranged = median_seed([_run(150.0, config_id="a"), _run(130.0, config_id="a"),
                          _run(170.0, config_id="a")])  # fmt: skip
    single = _run(80.0, config_id="b")
    assert seed_range(ranged) == (130.0, 170.0) and seed_range(single) == (None, None)
    frame = table([ranged, single], 90, 80.0)
    assert frame["capacity_seed_low_qps"].tolist()[0] == 130.0
    assert frame["capacity_seed_high_qps"].tolist()[0] == 170.0
    assert frame["capacity_seed_low_qps"].isna().tolist() == [False, True]
    record = seeds_record([ranged, single], 3, 42)
    assert record["seeds"] == [42, 43, 44] and set(record["scores"]) == {"a"}
    assert record["spread"]["a"] == pytest.approx(170 / 130 - 1, abs=1e-4)
    assert record["median_spread"] == record["spread"]["a"]
    said = seeds_sentence(record)
    assert "3 noise seeds (42–44)" in said and "31% at most (a)" in said


def test_the_config_refuses_a_count_that_is_not_one_or_more() -> None:
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ConfigError, match=r"tune\.sim_seeds"):
            TuneOptions(sim_seeds=bad)  # type: ignore[arg-type]


def test_the_seeds_sentence_without_any_capacity_names_no_spread() -> None:
    record = seeds_record([_run(None, config_id="a"), _run(None, config_id="b")], 3, 42)
    said = seeds_sentence(record)
    assert "3 noise seeds (42–44)" in said
    assert "closer than that" not in said  # "that" was a spread the sentence never gave
    assert "no capacity over them to spread" in said
