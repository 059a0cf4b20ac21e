"""Multi-turn sessions: the draw, the prompt-growth invariant, what they leave unchanged, and every
bad multi-turn trace named by file, row and column."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpu_simulate_test.config.registry import to_typed
from gpu_simulate_test.config.schema import (
    DurationDistConfig,
    LengthDistConfig,
    SessionConfig,
    WorkloadStageConfig,
)
from gpu_simulate_test.core.traffic.sampling import sample_durations
from gpu_simulate_test.core.traffic.sessions import draw_sessions
from gpu_simulate_test.core.traffic.trace import load_trace
from gpu_simulate_test.core.traffic.workloads import Workload, generate
from gpu_simulate_test.io.artifacts import ArtifactError

OUTPUTS = LengthDistConfig(kind="uniform", min=4, max=16)


@pytest.fixture
def typed(compose_stage):
    def _typed(overrides: list[str]) -> WorkloadStageConfig:
        return to_typed(compose_stage("workload", overrides), WorkloadStageConfig)

    return _typed


def _assert_grows(workload: Workload) -> None:
    """Every turn >= 1's prompt is the previous prompt + the previous output + its message."""
    sessions = workload.sessions
    assert sessions is not None
    prefill, decode = workload.num_prefill_tokens, workload.num_decode_tokens
    later = np.flatnonzero(sessions.turn > 0)
    assert later.size > 0
    assert np.array_equal(
        prefill[later], prefill[later - 1] + decode[later - 1] + sessions.user_tokens[later]
    )
    assert np.array_equal(sessions.session_id[later], sessions.session_id[later - 1])
    assert np.array_equal(sessions.turn[later], sessions.turn[later - 1] + 1)


def test_same_seed_same_sessions_other_seed_other_sessions() -> None:
    cfg = SessionConfig(enabled=True)
    (a, da), (b, db), (c, _) = (draw_sessions(cfg, OUTPUTS, seed, 50) for seed in (1, 1, 2))
    for key, values in a.columns().items():
        assert np.array_equal(values, b.columns()[key]), key
    assert np.array_equal(da, db)
    assert not np.array_equal(a.turns_per_session(), c.turns_per_session())
    assert a.num_sessions == c.num_sessions == 50
    assert set(a.turns_per_session().tolist()) == {2, 3, 4}  # the default turns: uniform 2-4
    assert (a.think_time_s[a.turn == 0] == 0).all() and (a.think_time_s[a.turn > 0] > 0).all()


def test_multi_turn_preset_prompts_grow_by_the_conversation(typed) -> None:
    cfg = typed(["workload=multi_turn"])
    workload, notes = generate(cfg.workload, cfg.model)
    sessions, prefixes = workload.sessions, workload.prefixes
    assert sessions is not None and prefixes is not None and notes == {}
    assert sessions.num_sessions == 32 and workload.num_requests == len(sessions.turn)
    _assert_grows(workload)
    first = sessions.first_rows
    assert np.array_equal(  # turn 0: the system prefix (32 tokens) + its user message
        workload.num_prefill_tokens[first], 32 + sessions.user_tokens[first]
    )
    assert (prefixes.request_prefix_len == 32).all()  # every turn's prompt starts with it
    think = sessions.think_time_s[sessions.turn > 0]
    assert ((think >= 0.5) & (think <= 2.0)).all()
    again, _ = generate(cfg.workload, cfg.model)
    assert again.fingerprint() == workload.fingerprint()
    other = typed(["workload=multi_turn", "workload.seed=1"])
    assert generate(other.workload, other.model)[0].fingerprint() != workload.fingerprint()


def test_sessions_arrive_as_requests_would_and_later_turns_have_no_arrival(typed) -> None:
    common = ["workload.num_requests=40", "workload.qps=3"]
    plain = typed(common)
    multi = typed([*common, "workload.session.enabled=true"])
    requests, _ = generate(plain.workload, plain.model)
    sessions_workload, _ = generate(multi.workload, multi.model)
    sessions = sessions_workload.sessions
    assert sessions is not None and sessions_workload.prefixes is None
    arrivals = sessions_workload.arrival_time_s
    # the sessions' starts are the arrivals 40 requests would have (the same stream and rate)
    assert np.array_equal(arrivals[sessions.first_rows], requests.arrival_time_s)
    assert np.isnan(arrivals[sessions.turn > 0]).all()
    first = sessions.first_rows
    assert np.array_equal(sessions_workload.num_prefill_tokens[first], sessions.user_tokens[first])
    _assert_grows(sessions_workload)


def test_a_session_over_the_context_is_named(typed) -> None:
    cfg = typed(
        [
            "workload=multi_turn",
            "workload.session.turns.kind=fixed",
            "workload.session.turns.value=40",
            "workload.session.turns.max=40",
            "workload.output_len.min=100",
            "workload.output_len.max=100",
        ]
    )
    with pytest.raises(ArtifactError, match=r"workload: session 0 turn \d+ \(request \d+\) has"):
        generate(cfg.workload, cfg.model)


@pytest.mark.parametrize(
    ("cfg", "low", "high"),
    [
        (DurationDistConfig(kind="fixed", value_s=2.5), 2.5, 2.5),
        (DurationDistConfig(kind="uniform", min_s=1.0, max_s=3.0), 1.0, 3.0),
        (DurationDistConfig(kind="exponential", mean_s=2.0, max_s=5.0), 0.0, 5.0),
        (DurationDistConfig(kind="lognormal", mean_s=1.0, sigma=0.5, min_s=0.2), 0.2, 600.0),
    ],
)
def test_think_times_follow_their_distribution(
    cfg: DurationDistConfig, low: float, high: float
) -> None:
    drawn = sample_durations(cfg, 2000, np.random.default_rng(0))
    assert drawn.min() >= low and drawn.max() <= high
    assert np.array_equal(drawn, np.round(drawn, 6))  # to the microsecond
    if cfg.kind == "exponential":
        assert np.mean(drawn) == pytest.approx(2.0, rel=0.1)
    if cfg.kind == "lognormal":
        assert np.median(drawn) == pytest.approx(1.0, rel=0.1)


HEADER = "session_id,turn,think_time_s,user_tokens,num_prefill_tokens,num_decode_tokens"
GOOD_ROWS = [  # session 7: 10, +5 out, +3 user = 18, +4 out, +2 user = 24; session 3: one turn
    "7,0,0,10,10,5",
    "7,1,1.5,3,18,4",
    "7,2,0.25,2,24,6",
    "3,0,0,6,20,2",
    "5,0,0,4,4,4",
    "5,1,2,1,9,1",
]


def _trace(tmp_path: Path, rows: list[str], header: str = HEADER) -> Path:
    path = tmp_path / "sessions.csv"
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def test_a_multi_turn_trace_imports_its_sessions(tmp_path: Path) -> None:
    trace = load_trace(_trace(tmp_path, GOOD_ROWS), 0, 4096, False)
    sessions = trace.sessions
    assert sessions is not None and trace.arrived_at_s is None and trace.total_rows == 6
    assert sessions.session_id.tolist() == [0, 0, 0, 1, 2, 2]  # renumbered in order
    assert sessions.turn.tolist() == [0, 1, 2, 0, 0, 1]
    assert sessions.think_time_s.tolist() == [0, 1.5, 0.25, 0, 0, 2]
    assert trace.num_prefill_tokens.tolist() == [10, 18, 24, 20, 4, 9]
    # workload.num_requests counts sessions: the first 2, never part of one
    first_two = load_trace(_trace(tmp_path, GOOD_ROWS), 2, 4096, False)
    assert first_two.sessions is not None
    assert first_two.sessions.session_id.tolist() == [0, 0, 0, 1]
    assert len(first_two.num_prefill_tokens) == 4


def test_a_timed_multi_turn_trace_has_arrivals_on_turn_0_only(tmp_path: Path) -> None:
    arrived = ["0", "", "", "0.5", "2", ""]
    rows = [f"{a},{r}" for a, r in zip(arrived, GOOD_ROWS, strict=True)]
    trace = load_trace(_trace(tmp_path, rows, "arrived_at," + HEADER), 0, 4096, False)
    assert trace.arrived_at_s is not None
    assert np.array_equal(trace.arrived_at_s, [0, np.nan, np.nan, 0.5, 2, np.nan], equal_nan=True)


def _replace(row: int, value: str) -> list[str]:
    rows = list(GOOD_ROWS)
    rows[row] = value
    return rows


@pytest.mark.parametrize(
    ("rows", "header", "message"),
    [
        (
            ["7,0,10,10,5"],
            "session_id,turn,user_tokens,num_prefill_tokens,num_decode_tokens",
            "has session column(s) session_id, turn, user_tokens but not think_time_s",
        ),
        (_replace(1, "7,2,1.5,3,18,4"), HEADER, "row 2, column 'turn': session 7 has turn 2"),
        (_replace(0, "7,1,0,10,10,5"), HEADER, "row 1, column 'turn': session 7 has turn 1"),
        (
            [*GOOD_ROWS, "7,0,0,4,4,4"],
            HEADER,
            "row 7, column 'session_id': session 7 starts again, after other sessions",
        ),
        (
            _replace(1, "7,1,-1,3,18,4"),
            HEADER,
            "row 2, column 'think_time_s': value -1 is below the minimum 0",
        ),
        (
            _replace(3, "3,0,2,6,20,2"),
            HEADER,
            "row 4, column 'think_time_s': turn 0 of session 3 has think time 2",
        ),
        (
            _replace(3, "3,0,0,30,20,2"),
            HEADER,
            "row 4, column 'user_tokens': turn 0 of session 3 has 30 user tokens",
        ),
        (
            _replace(2, "7,2,0.25,2,25,6"),
            HEADER,
            "row 3, column 'num_prefill_tokens': session 7 turn 2 has 25 prompt tokens, not the "
            "previous turn's 18 prompt + 4 output + its 2 user tokens = 24",
        ),
        (
            _replace(2, "7,2,0.25,2,24,5000"),
            HEADER,
            "row 3, column 'num_prefill_tokens': session 7 turn 2: num_prefill_tokens + "
            "num_decode_tokens = 5024 exceeds the model's max context 4096",
        ),
        (
            ["0," + r for r in GOOD_ROWS],
            "arrived_at," + HEADER,
            "row 2, column 'arrived_at': turn 1 has an arrival time (0)",
        ),
        (
            ["," + r for r in GOOD_ROWS],
            "arrived_at," + HEADER,
            "row 1, column 'arrived_at': empty: a session's turn 0 needs an arrival time",
        ),
        (
            [f"{a},{r}" for a, r in zip(["1", "", "", "0.5", "2", ""], GOOD_ROWS, strict=True)],
            "arrived_at," + HEADER,
            "row 4, column 'arrived_at': values must be sorted (non-decreasing); 0.5 follows 1",
        ),
    ],
)
def test_bad_multi_turn_traces_fail_naming_file_row_and_column(
    tmp_path: Path, rows: list[str], header: str, message: str
) -> None:
    path = _trace(tmp_path, rows, header)
    with pytest.raises(ArtifactError) as err:
        load_trace(path, 0, 4096, True)  # clipping never applies to a session
    assert message in str(err.value)
    assert str(path) in str(err.value)
