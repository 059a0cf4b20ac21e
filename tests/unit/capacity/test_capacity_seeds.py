"""``capacity.sim_seeds``: the median seed's search answers, every seed's answer beside it."""

from __future__ import annotations

import dataclasses

import pytest

from gpu_simulate_test.capacity.search import Answer
from gpu_simulate_test.capacity.seeds import median_seed, seeds_record, seeds_sentence
from gpu_simulate_test.config.capacity import CapacityOptions
from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.config.vidur import VidurConfig, derived_seed


def _answer(qps: float | None) -> Answer:
    return Answer(qps, (qps or 1.0, None))


def test_the_median_seed_answers() -> None:
    assert median_seed([_answer(150.0), _answer(130.0), _answer(170.0)]) == 0
    assert median_seed([_answer(170.0), _answer(130.0), _answer(150.0)]) == 2
    # an even count: the lower middle; a search that met no rate counts lowest
    assert median_seed([_answer(150.0), _answer(None), _answer(120.0), _answer(170.0)]) == 2
    # seeds that answered alike: the first of them (the configured seed where all agree)
    assert median_seed([_answer(90.0), _answer(90.0), _answer(90.0)]) == 0
    assert median_seed([_answer(95.0), _answer(90.0), _answer(90.0)]) == 1


def test_the_record_and_its_sentence() -> None:
    record = seeds_record([_answer(150.0), _answer(130.0), _answer(None)], 42, 1)
    assert record == {
        "count": 3,
        "seeds": [42, 43, 44],
        "answers_qps": [150.0, 130.0, None],
        "chosen_seed": 43,
        "spread": round(150 / 130 - 1, 4),
    }
    said = seeds_sentence(record, "req/s")
    assert "3 noise seeds (42–44) answered 150, 130, none req/s, 15% apart" in said
    assert "the median one (seed 43) answers" in said
    assert seeds_record([_answer(None), _answer(80.0)], 0, 0)["spread"] is None


def test_seeds_past_the_last_wrap_to_the_first() -> None:
    # vidur.seed=4294967295 with three noise seeds: the second was 2**32, which the config
    # refuses (numpy's range), mid-run
    last = 2**32 - 1
    assert [derived_seed(last, k) for k in range(3)] == [last, 0, 1]
    assert derived_seed(42, 2) == 44
    record = seeds_record([_answer(150.0), _answer(130.0), _answer(170.0)], last, 1)
    assert record["seeds"] == [last, 0, 1] and record["chosen_seed"] == 0
    assert f"3 noise seeds ({last}, 0, 1) answered" in seeds_sentence(record, "req/s")
    assert dataclasses.replace(VidurConfig(seed=last), seed=derived_seed(last, 1)).seed == 0


def test_the_config_refuses_a_count_that_is_not_one_or_more() -> None:
    for bad in (0, -2, False, 1.5):
        with pytest.raises(ConfigError, match=r"capacity\.sim_seeds"):
            CapacityOptions(sim_seeds=bad)  # type: ignore[arg-type]
