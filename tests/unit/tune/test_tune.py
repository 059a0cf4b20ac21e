"""The tune's pure parts: the space and vLLM's rules, the calibration's backend, the seeding
order, the ranking, the frontier, the flags, the rank correlation and the config's refusals."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_simulate_test.capacity.bracket import BracketRule, bracket_search
from gpu_simulate_test.capacity.search import Answer, Point
from gpu_simulate_test.config.backends import VllmBackendConfig
from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.config.tune import TuneOptions, TuneStageConfig, knob_values
from gpu_simulate_test.config.vidur import VidurSchedulerConfig
from gpu_simulate_test.core.engines.knobs import derive_scheduler, knob_mismatches
from gpu_simulate_test.tune.rank import pareto, ranked, spearman
from gpu_simulate_test.tune.simulate import Simulated, nearest
from gpu_simulate_test.tune.space import (
    CONFIGURED_ID,
    calibration_backend,
    candidates,
    serve_flags,
)
from gpu_simulate_test.tune.verify import launch_delay
from tests.vidur_bundle_factory import QWEN3_TINY

BACKEND = VllmBackendConfig(max_num_batched_tokens=128, max_num_seqs=8, num_gpu_blocks_override=256)


def test_knob_values_take_lists_ranges_and_refuse_the_rest() -> None:
    assert knob_values("max_num_seqs", [8, 16, 8]) == (8, 16)
    assert knob_values("max_num_seqs", "8:64:x2") == (8, 16, 32, 64)
    assert knob_values("max_num_batched_tokens", "64:256:+64") == (64, 128, 192, 256)
    assert knob_values("enable_prefix_caching", [False, True]) == (False, True)
    assert knob_values("num_gpu_blocks_override", 512) == (512,)
    for name, given, said in (
        ("max_seqs", [8], "not a knob"),
        ("max_num_seqs", [], "empty"),
        ("max_num_seqs", [0], "positive whole number"),
        ("max_num_seqs", [True], "positive whole number"),
        ("enable_prefix_caching", [1], "true or false"),
        ("max_num_seqs", "8:64", "lo:hi:xF"),
        ("max_num_seqs", "64:8:x2", "1 <= lo <= hi"),
        ("max_num_seqs", "8:64:x1", "grows"),
    ):
        with pytest.raises(ConfigError, match=said):
            knob_values(name, given)


def options(**space: Any) -> TuneOptions:
    return TuneOptions(space=space)


def test_the_space_is_every_combination_checked_by_vllm_s_rules() -> None:
    found = candidates(
        options(max_num_seqs=[8, 64], max_num_batched_tokens=[32, 128]), BACKEND, QWEN3_TINY, 80
    )
    ids = [c.config_id for c in found]
    assert ids == ["s8-t32", "s8-t128", "s64-t32", "s64-t128"]  # the configured is s8-t128
    assert [c.configured for c in found] == [False, True, False, False]
    refused = {c.config_id: c.invalid for c in found if c.invalid}
    assert set(refused) == {"s64-t32"}
    assert "max_num_batched_tokens (32) must be >= max_num_seqs (64)" in refused["s64-t32"]
    # without chunked prefill vLLM wants the budget to hold max_model_len (255 blocks of 32)
    found = candidates(options(enable_chunked_prefill=[True, False]), BACKEND, QWEN3_TINY, 80)
    assert [c.config_id for c in found] == ["chunk", "nochunk"]
    assert "max_model_len (4096" in found[1].invalid
    # a space without the configured backend gets it appended, last
    found = candidates(options(max_num_seqs=[2, 4]), BACKEND, QWEN3_TINY, 80)
    assert [c.config_id for c in found] == ["s2", "s4", CONFIGURED_ID] and found[-1].configured
    # a workload longer than max_model_len is refused everywhere: one clear error
    with pytest.raises(ConfigError, match="refuse every configuration"):
        candidates(options(max_num_seqs=[2, 4]), BACKEND, QWEN3_TINY, 10_000)


def test_one_calibration_covers_every_valid_configuration() -> None:
    found = candidates(
        options(max_num_seqs=[4, 64], max_num_batched_tokens=[32, 512],
                enable_prefix_caching=[False, True]),
        BACKEND, QWEN3_TINY, 80,
    )  # fmt: skip
    cal = calibration_backend(found)
    # s64-t32 is refused, so its 64 counts only with t512
    assert (cal.max_num_seqs, cal.max_num_batched_tokens) == (64, 512)
    assert cal.enable_prefix_caching and cal.enable_chunked_prefill
    assert cal.num_gpu_blocks_override == BACKEND.num_gpu_blocks_override


def test_each_configuration_s_scheduler_mirrors_its_knobs() -> None:
    off = VllmBackendConfig(enable_chunked_prefill=False, max_num_batched_tokens=4096)
    scheduler, derived = derive_scheduler(off, VidurSchedulerConfig(), 64)
    assert derived and scheduler.name == "vllm_v1" and not scheduler.enable_chunked_prefill
    assert scheduler.chunk_size == 4096
    mismatch = knob_mismatches(
        {"name": "vllm", "enable_chunked_prefill": True, "enable_prefix_caching": False},
        {"name": "vllm_v1", "enable_chunked_prefill": False},
    )
    assert mismatch["chunked prefill"] == ("on", "off")
    with pytest.raises(ConfigError, match="always chunks"):
        VidurSchedulerConfig(name="sarathi", enable_chunked_prefill=False)


def sim(config_id: str, capacity: float | None, ttft: float, error: str = "") -> Simulated:
    found = candidates(options(max_num_seqs=[2]), BACKEND, QWEN3_TINY, 80)
    candidate = found[0].__class__(config_id, found[0].knobs, BACKEND, False, error)
    point = Point(10.0, "grid", {"ttft_p90": ttft}, True)
    answer = None if capacity is None else Answer(capacity, (capacity, None), (point,))
    return Simulated(candidate, answer, point, error)


def test_the_ranking_the_frontier_and_the_flags() -> None:
    sims = [sim("a", 10, 50), sim("b", 20, 80), sim("c", 20, 60), sim("d", None, 90),
            sim("e", 30, 1, error="refused")]  # fmt: skip
    order = [s.candidate.config_id for s in ranked(sims, "capacity", "ttft", 90)]
    assert order == ["c", "b", "a", "d", "e"]  # ties on capacity go to the lower latency
    assert pareto([("a", 10, 50), ("b", 20, 80), ("c", 20, 60)]) == ["a", "c"]
    knobs = {"max_num_seqs": 8, "max_num_batched_tokens": 128, "num_gpu_blocks_override": 256,
             "enable_chunked_prefill": True, "enable_prefix_caching": False}  # fmt: skip
    flags = serve_flags(knobs)
    assert flags == ["--max-num-seqs 8", "--max-num-batched-tokens 128",
                     "--num-gpu-blocks-override 256", "--enable-chunked-prefill",
                     "--no-enable-prefix-caching"]  # fmt: skip


def test_spearman() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3], [1, 3, 2]) == pytest.approx(0.5)
    assert spearman([1, 2], [1, 2]) is None
    assert spearman([1, 1, 1], [1, 2, 3]) is None


def test_the_next_configuration_is_the_nearest_one_done() -> None:
    found = candidates(
        options(max_num_seqs=[2, 8], max_num_batched_tokens=[32, 128]), BACKEND, QWEN3_TINY, 80
    )
    by_id = {c.config_id: c for c in found}
    done = {"s8-t128": Simulated(by_id["s8-t128"], Answer(40.0, (40.0, 42.0)))}
    todo = [by_id["s2-t32"], by_id["s2-t128"], by_id["s8-t32"]]
    candidate, seed = nearest(todo, done, 1.0)
    assert candidate.config_id == "s2-t128" and seed == 40.0  # one knob apart, first in order
    candidate, seed = nearest(todo, {}, 7.0)
    assert candidate is todo[0] and seed == 7.0


def test_a_first_step_as_wide_as_the_bracket_ends_a_right_guess_in_two_rates() -> None:
    knee = 41.0

    def evaluate(qps: float, phase: str) -> Point:
        return Point(qps, phase, {}, qps <= knee)

    rule = BracketRule(1.5, 0.05, max_steps=12, first_step=1.049)
    answer, _ = bracket_search(evaluate, 40.0, rule)
    assert len(answer.points) == 2 and answer.qps == 40.0
    far, _ = bracket_search(evaluate, 400.0, rule)  # then steps of 1.5, and bisection
    assert far.qps is not None and far.qps <= knee < far.bracket[1]  # type: ignore[operator]
    assert far.bracket[1] / far.qps <= 1.05  # type: ignore[operator]


def test_the_config_refuses_what_the_tune_cannot_do() -> None:
    with pytest.raises(ConfigError, match="searches vLLM's knobs"):
        TuneStageConfig(backend=_hf_cb())
    with pytest.raises(ConfigError, match=r"tune\.qps"):
        TuneOptions(objective="goodput")
    with pytest.raises(ConfigError, match="verify=false"):
        TuneOptions(objective="goodput", qps=5.0, verify="top_k")
    with pytest.raises(ConfigError, match="empty"):
        TuneOptions().knobs()
    assert TuneOptions(verify="true").verify == "top_k"
    with pytest.raises(ConfigError, match=r"tune\.servers_at_once=0 must be a whole number >= 1"):
        TuneOptions(servers_at_once=0)
    with pytest.raises(ConfigError, match=r"tune\.server_stagger_s=-1\.0 must be seconds"):
        TuneOptions(server_stagger_s=-1.0)


def test_a_server_launches_a_stagger_after_the_last_one_still_starting() -> None:
    # none starting, or no stagger: at once
    assert launch_delay([], 100.0, 10.0) == 0.0
    assert launch_delay([99.0], 100.0, 0.0) == 0.0
    # 10 s after the latest launch of those still starting, counted from its launch
    assert launch_delay([95.0, 98.0], 100.0, 10.0) == pytest.approx(8.0)
    # that moment passed: at once
    assert launch_delay([80.0], 100.0, 10.0) == 0.0


def _hf_cb() -> Any:
    from gpu_simulate_test.config.backends import HfCbBackendConfig

    return HfCbBackendConfig()


def _checked(*levels: tuple[float, int] | None) -> list[dict[str, Any]]:
    return [
        {"server_step_level": None if lv is None else {"ratio": lv[0], "steps": lv[1]}}
        for lv in levels
    ]


def test_servers_all_faster_than_the_calibration_say_it_and_what_to_do() -> None:
    from gpu_simulate_test.tune.verify import calibration_speed

    # the top_k servers of benchmarks/results/tune_20261128b
    speed = calibration_speed(
        _checked((0.914, 1482), (0.8455, 2144), (0.9485, 1956), (0.8609, 2677))
    )
    assert speed is not None and speed["servers"] == 4 and speed["one_sided"]
    assert speed["pooled_level"] == pytest.approx(0.887, abs=0.001)
    assert "ran faster" in speed["note"] and "likely low" in speed["note"]
    assert "re-calibrate" in speed["note"]
    slower = calibration_speed(_checked((1.12, 100), (1.09, 300)))
    assert slower is not None and "ran slower" in slower["note"] and "likely high" in slower["note"]


@pytest.mark.parametrize(
    "levels",
    [
        ((0.9, 500), (1.05, 500)),  # two-signed: the servers' own spread
        ((0.95, 500), (0.97, 500)),  # one-signed, but within 8%
        ((0.8, 500),),  # one server is one server
        ((0.85, 500), None),  # a server without a level counts for nothing
    ],
)
def test_a_calibration_speed_note_only_when_every_server_is_well_off_on_one_side(
    levels: tuple[tuple[float, int] | None, ...],
) -> None:
    from gpu_simulate_test.tune.verify import calibration_speed

    speed = calibration_speed(_checked(*levels))
    assert speed is not None and speed["note"] == ""


def test_no_level_no_calibration_speed() -> None:
    from gpu_simulate_test.tune.verify import calibration_speed

    assert calibration_speed(_checked(None, None)) is None
    assert calibration_speed([]) is None


def test_names_of_configurations_at_one_place_stack_on_the_plot() -> None:
    from gpu_simulate_test.tune.plots import label_rows

    # s32-t512 and s32-t128 simulate alike, s8-t512 and s8-t128 too; s2 apart from both
    xs = [38.0, 38.5, 92.0, 93.0, 12000.0]
    ys = [67.79, 67.61, 47.55, 47.55, 9.66]
    assert label_rows(xs, ys) == [0, 1, 0, 1, 0]
    # a third at the same place goes above the second
    assert label_rows([10.0, 10.0, 10.0], [5.0, 5.0, 5.0]) == [0, 1, 2]
    assert label_rows([], []) == []
