"""A current calibration seen as an older version's (orchestrate/older_view, issue 63):
what each later version added is taken out, row by row and key by key, the rest is left byte for
byte, and the view reads back as that version's calibration, the simulation's note naming it."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from gpu_simulate_test.calibration import serving_replay
from gpu_simulate_test.calibration.frontend_queue import FrontEndQueue
from gpu_simulate_test.calibration.input_spread import SPREAD_LEVELS
from gpu_simulate_test.calibration.record import CALIBRATION_VERSION, CalibrationRecord
from gpu_simulate_test.core.profiling.bundle import SERVING_STEPS_TABLE, load_bundle
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import read_json, write_csv, write_json
from gpu_simulate_test.orchestrate import older_view as tool
from tests.unit.calibration.test_serving_load import schedule
from tests.vidur_bundle_factory import QWEN3_TINY, write_synthetic_bundle

BURSTS = ["vllm,prefill,2,16,16,9.1,3,2", "vllm,mixed,6,16,38,10.96,6,2"]
LONGER = ["vllm,decode,1,1,148,7.07,120,1", "vllm,decode,4,1,252,9.05,40,1"]
CACHED = ["vllm,cached_prefill,1,16,80,7.55,3,1"]
ENGINE_STEPS = [
    "backend,phase,batch_size,num_q_tokens,context_tokens,step_ms,samples,num_prompts",
    "vllm,prefill,1,16,16,8.02,3,1",
    "vllm,prefill,1,256,256,10.84,3,1",
    *CACHED,
    "vllm,decode,1,1,44,6.88,120,1",
    "vllm,decode,4,1,44,8.26,42,1",
    LONGER[0],
    LONGER[1],
    "vllm,mixed,2,16,38,9.53,3,1",
    "vllm,mixed,5,256,38,13.67,3,1",
    *BURSTS,
    "hf_cb,prefill,1,16,16,20.0,3,",  # another backend's rows, left as they are
    "hf_cb,decode,1,1,148,15.5,4,",
]
QUIET = {  # the experiments' input line (version 10 and before: the front end's own)
    "input_ms": 3.0,
    "input_per_running_ms": 0.25,
    "measured_input_ms": {"0": 3.0, "4": 3.6},
    "samples": {"0": 18, "4": 6},
}
QUEUE = {"request_ms": 0.3, "step_ms": 0.5, "token_ms": 0.05}
FRONT_V10 = {**QUIET, "output_ms": 2.0, "source": "engine stamps", "requests": 24, "queue": QUEUE}
SPREAD = {"0": [k / 10 - 1 for k in range(len(SPREAD_LEVELS))]}
FRONT_V11 = {
    **FRONT_V10,
    "input_ms": 3.7,
    "input_per_running_ms": 0.19,
    "measured_input_ms": {"0": 3.7, "8": 5.2},
    "samples": {"0": 40, "8": 12},
    "input_source": "calibration replays under load",
    "input_requests": 52,
    "experiments_input": QUIET,
}
FRONT_V12 = {
    **FRONT_V11,
    "input_residual_ms": SPREAD,
    "experiments_input": {**QUIET, "input_residual_ms": {}},
}
QUEUE_V13: dict[str, float] = {**QUEUE, "first_ms": 1.2, "first_tokens": 30}
FRONT_V13 = {**FRONT_V12, "queue": QUEUE_V13}
FRONT_V14 = {  # the line refitted without the idle sends, the one over every send beside
    **FRONT_V13,
    "input_ms": 3.2,
    "input_per_running_ms": 0.25,
    "input_idle_ms": 4.1,
    "input_idle_requests": 20,
    "input_all_sends": {"input_ms": 3.7, "input_per_running_ms": 0.19},
}
FRONT_V15 = {  # the line fitted through the steps, the one through the windows' middles beside
    **FRONT_V14,
    "input_ms": 2.6,
    "input_per_running_ms": 0.02,
    "input_midpoint": {"input_ms": 3.2, "input_per_running_ms": 0.25},
    "input_through_steps": {
        "mean_abs_error_ms": 0.8,
        "midpoint_mean_abs_error_ms": 1.5,
        "requests": 40,
    },
}
IDLE_BACK_SPREAD = [round(-0.5 + 0.1 * k, 2) for k in range(21)]
FRONT_V16 = {  # an idle engine's first token's spread around the queue's way back
    **FRONT_V15,
    "queue": {**QUEUE_V13, "first_idle_residual_ms": IDLE_BACK_SPREAD, "first_idle_tokens": 25},
}
BUSY_BACK_SPREAD = {"1": IDLE_BACK_SPREAD, "4": [round(2 * v, 2) for v in IDLE_BACK_SPREAD]}
FRONT_V18 = {  # a busy engine's first token's spread, per bucket of requests in flight
    **FRONT_V16,
    "queue": {
        **QUEUE_V13,
        "first_idle_residual_ms": IDLE_BACK_SPREAD,
        "first_idle_tokens": 25,
        "first_busy_residual_ms": BUSY_BACK_SPREAD,
        "first_busy_tokens": 90,
    },
}
BUSY_HOP_SPREAD = [round(-1.0 + 0.4 * k, 2) for k in range(21)]
FRONT_V19 = {  # a busy engine's way in, its spread around the line fitted through the steps
    **FRONT_V18,
    "busy_hop_residual_ms": {"1": BUSY_HOP_SPREAD},
    "busy_hop_requests": 120,
}
EXPERIMENTS_V10 = [["cached_prefill", 1, 16, 64], ["decode", 1, 32], ["prefill", 1, 16]]
ANALYSIS_V11 = [{"candidate": "arrival_rate", "steps": 9}]


def info(version: int) -> dict[str, Any]:
    """vllm's meta.json entry as calibration ``version`` writes it, from its literal parts."""
    settings: dict[str, Any] = {"decode_prompt_tokens": 32, "decode_tokens": 16}
    experiments = EXPERIMENTS_V10 if version >= 10 else EXPERIMENTS_V10[1:]
    frontend: dict[str, Any] = {
        21: FRONT_V19,  # the same keys, the replays recorded with no write between steps
        20: FRONT_V19,  # the same keys, the busy way in's spread read with drains as drains
        19: FRONT_V19,
        18: FRONT_V18,
        17: FRONT_V16,
        16: FRONT_V16,
        15: FRONT_V15,
        14: FRONT_V14,
        13: FRONT_V13,
        12: FRONT_V12,
        11: FRONT_V11,
    }.get(version, FRONT_V10)
    if version >= 11:
        settings["bursts"] = True
        experiments = [["burst", 0, 16, 2], *experiments, ["decode", 4, 240]]
    if version < 8:
        frontend = {k: v for k, v in frontend.items() if k != "queue"}
    analysis = [*ANALYSIS_V11, {"candidate": "client_sends"}] if version >= 12 else ANALYSIS_V11
    return copy.deepcopy(
        {
            "version": version,
            "settings": settings,
            "experiments": experiments,
            "frontend": frontend,
            "serving": {"rates_qps": [5.0], "residuals": {"residuals": analysis}},
            "step_jitter": {"percentiles": [0, 50, 100], "ratios": [0.9, 1.0, 1.3]},
            "engine": {},
        }
    )


def current(root: Path, backends: tuple[str, ...] = ("vllm",)) -> Path:
    """A synthetic bundle calibrated by this code: engine and serving steps, meta.json."""
    path = write_synthetic_bundle(root, QWEN3_TINY, points=6)
    (path / layout.ENGINE_STEPS).write_text("\n".join(ENGINE_STEPS) + "\n")
    steps = schedule()
    sends = (steps["start_time_s"] + 1e-6).tolist()[::3]  # one send in every third step
    replayed = serving_replay.serving_steps(steps, [(5.0, 0.0, 1e9)], "vllm", sends)
    write_csv(path / layout.SERVING_STEPS, replayed, SERVING_STEPS_TABLE)
    meta = read_json(path / layout.BUNDLE_META)
    calibrations = {b: info(CALIBRATION_VERSION) for b in backends}
    write_json(path / layout.BUNDLE_META, {**meta, "engine_calibration": calibrations})
    return path


def offsets_line(bundle: Path) -> str:
    """Version 17's line for ``bundle``'s serving steps: its steps with a send emptied."""
    table = pd.read_csv(bundle / layout.SERVING_STEPS, keep_default_na=False)
    return OFFSETS_LINE.format(int((table["client_send_offsets_ms"] != "").sum()))


def test_a_version_20_view_keeps_every_file_and_says_so(tmp_path: Path) -> None:
    bundle = current(tmp_path / "profiles")
    lines = tool.older_view(bundle, tmp_path / "view", 20)
    assert lines[:-1] == [WRITES_KEPT]
    view = tmp_path / "view" / "cpu" / QWEN3_TINY.name
    assert read_json(view / layout.BUNDLE_META)["engine_calibration"] == {"vllm": info(20)}
    for name in (layout.ENGINE_STEPS, layout.SERVING_STEPS):
        assert (view / name).read_bytes() == (bundle / name).read_bytes()


def test_a_version_18_view_loses_only_the_busy_way_ins_spread(tmp_path: Path) -> None:
    bundle = current(tmp_path / "profiles")
    now = CalibrationRecord.load(load_bundle(bundle), "vllm").frontend
    assert now is not None and now.busy_hop_residual_ms == ((1, tuple(BUSY_HOP_SPREAD)),)
    lines = tool.older_view(bundle, tmp_path / "view", 18)
    assert lines[:-1] == [WRITES_KEPT, DRAINS_KEPT, BUSY_IN]
    view = tmp_path / "view" / "cpu" / QWEN3_TINY.name
    assert read_json(view / layout.BUNDLE_META)["engine_calibration"] == {"vllm": info(18)}
    front = CalibrationRecord.load(load_bundle(view), "vllm").frontend
    assert front is not None and front.busy_hop_residual_ms == ()
    queue = CalibrationRecord.load(load_bundle(view), "vllm").frontend_queue
    assert queue is not None and [k for k, _ in queue.first_busy_residual_ms] == [1, 4]  # kept


def test_a_version_17_view_loses_only_the_busy_way_backs_spread(tmp_path: Path) -> None:
    bundle = current(tmp_path / "profiles")
    now = CalibrationRecord.load(load_bundle(bundle), "vllm").frontend_queue
    assert now is not None and [k for k, _ in now.first_busy_residual_ms] == [1, 4]
    lines = tool.older_view(bundle, tmp_path / "view", 17)
    assert lines[:-1] == [WRITES_KEPT, DRAINS_KEPT, BUSY_IN, BUSY_BACK]
    view = tmp_path / "view" / "cpu" / QWEN3_TINY.name
    assert read_json(view / layout.BUNDLE_META)["engine_calibration"] == {"vllm": info(17)}
    queue = CalibrationRecord.load(load_bundle(view), "vllm").frontend_queue
    assert queue is not None and queue.first_busy_residual_ms == ()
    assert queue.first_idle_residual_ms == tuple(IDLE_BACK_SPREAD)  # version 16's, kept


def test_a_version_16_view_loses_only_the_sends_offsets(tmp_path: Path) -> None:
    bundle = current(tmp_path / "profiles")
    lines = tool.older_view(bundle, tmp_path / "view", 16)
    assert lines[:-1] == [WRITES_KEPT, DRAINS_KEPT, BUSY_IN, BUSY_BACK, offsets_line(bundle)]
    view = load_bundle(tmp_path / "view" / "cpu" / QWEN3_TINY.name)
    steps = CalibrationRecord.load(view, "vllm").serving_steps
    assert steps is not None and "client_send_offsets_ms" not in steps
    assert steps["client_sends"].sum() > 0  # the counts kept: the intake wherever a send falls


def without_last_column(lines: list[str]) -> str:
    return "".join(line.rsplit(",", 1)[0] + "\n" for line in lines)


@pytest.mark.parametrize("version", [11, 10, 9, 7])
def test_a_view_holds_what_its_version_measured_and_reads_back_as_it(
    tmp_path: Path, version: int
) -> None:
    bundle = current(tmp_path / "profiles")
    before = {p.name: p.read_bytes() for p in bundle.iterdir()}
    lines = tool.older_view(bundle, tmp_path / "view", version)
    view = tmp_path / "view" / "cpu" / QWEN3_TINY.name
    assert {p.name: p.read_bytes() for p in bundle.iterdir()} == before  # the source untouched
    for name in (layout.MLP_PROFILE, layout.ATTENTION_PROFILE):
        assert (view / name).read_bytes() == before[name]
    if version == 11:  # the bursts and the longer decodes are version 11's own
        assert (view / layout.ENGINE_STEPS).read_bytes() == before[layout.ENGINE_STEPS]
    else:  # every other row as it was, num_prompts out (no backend's row has one left)
        gone = BURSTS + LONGER + (CACHED if version < 10 else [])
        kept = [line for line in ENGINE_STEPS if line not in gone]
        assert (view / layout.ENGINE_STEPS).read_text() == without_last_column(kept)
    serving = before[layout.SERVING_STEPS].decode().splitlines()
    assert serving[0].endswith(",client_sends,client_send_offsets_ms")
    assert (view / layout.SERVING_STEPS).read_text() == without_last_column(
        without_last_column(serving).splitlines()
    )
    meta = read_json(view / layout.BUNDLE_META)
    assert meta.pop("engine_calibration") == {"vllm": info(version)}
    assert meta == {k: v for k, v in read_json(bundle / layout.BUNDLE_META).items()
                    if k != "engine_calibration"}  # fmt: skip

    record = CalibrationRecord.load(load_bundle(view), "vllm")
    assert record.version == version and record.frontend is not None
    assert record.serving_steps is not None and "client_sends" not in record.serving_steps
    assert record.frontend.input_residual_ms == ()
    assert record.frontend.input_ms == (3.7 if version == 11 else 3.0)
    assert record.frontend.quiet_input_ms == (3.0 if version == 11 else None)
    assert (record.frontend_queue is None) == (version < 8)
    assert set(record.steps["phase"]) == {"prefill", "decode", "mixed"} | (
        {"cached_prefill"} if version >= 10 else set()
    )
    decodes = record.steps["context_tokens"][record.steps["phase"] == "decode"]
    assert set(decodes) == ({44, 148, 252} if version == 11 else {44})
    assert ("num_prompts" in record.steps) == (version == 11)  # version 11 began it
    assert f"is version {version}, this code calibrates version {CALIBRATION_VERSION}" in lines[-1]
    said = lines[:-1]
    bursts = "11: engine_steps.csv: 2 burst rows (num_prompts > 1), the column num_prompts"
    assert (bursts in said) == (version < 11)
    assert ("11: engine_steps.csv: 2 decode rows at context_tokens [148, 252]" in said) == (
        version < 11
    )
    assert ("10: engine_steps.csv: 1 cached_prefill rows (1 experiments)" in said) == (version < 10)
    assert ("8: frontend.queue: no front end as a queue" in said) == (version < 8)
    assert FIRST_CHUNK in said and IDLE_LINE in said and STEPS_LINE in said and IDLE_BACK in said
    assert BUSY_BACK in said and BUSY_IN in said and DRAINS_KEPT in said and WRITES_KEPT in said
    assert sorted({int(line.split(":")[0]) for line in said}) == list(
        range(version + 1, CALIBRATION_VERSION + 1)
    )


IDLE_LINE = (
    "14: frontend.input_idle_ms: the idle engine's way in on the line, the line over every send "
    "put back (input_ms 3.7, input_per_running_ms 0.19)"
)
STEPS_LINE = (
    "15: frontend.input_through_steps: the input line through the windows' middles put back "
    "(input_ms 3.2, input_per_running_ms 0.25)"
)
IDLE_BACK = "16: frontend.queue.first_idle_residual_ms: no spread on an idle engine's way back"
BUSY_BACK = "18: frontend.queue.first_busy_residual_ms: no spread on a busy engine's way back"
BUSY_IN = "19: frontend.busy_hop_residual_ms: a busy engine's way in on the line"
WRITES_KEPT = (
    "21: kept: serving_steps.csv, recorded with no write between two steps (no undoing it: the "
    "pause before a step that takes a request in as vLLM's own)"
)
DRAINS_KEPT = (
    "20: kept: frontend.busy_hop_residual_ms, read with a working engine's late stamps as drains "
    "(version 19 read them as arrivals; the bundle holds no stamps to read it again)"
)
OFFSETS_LINE = (
    "17: serving_steps.csv client_send_offsets_ms ({} steps): the intake wherever a send falls"
)
SPREAD_KEPT = "14: kept: frontend.input_residual_ms, the spread around the two-piece way in"
FIRST_CHUNK = "13: frontend.queue.first_ms: no first-chunk cost on the way back"


def test_a_version_13_view_puts_the_idle_way_in_back_on_the_line(tmp_path: Path) -> None:
    bundle = current(tmp_path / "profiles")
    lines = tool.older_view(bundle, tmp_path / "view", 13)
    view = tmp_path / "view" / "cpu" / QWEN3_TINY.name
    assert lines[:-1] == [
        WRITES_KEPT,
        DRAINS_KEPT,
        BUSY_IN,
        BUSY_BACK, offsets_line(bundle), IDLE_BACK, STEPS_LINE, IDLE_LINE, SPREAD_KEPT
    ]  # fmt: skip
    assert read_json(view / layout.BUNDLE_META)["engine_calibration"] == {"vllm": info(13)}
    front = CalibrationRecord.load(load_bundle(view), "vllm").frontend
    assert front is not None and front.input_idle_ms is None
    assert front.input_delays_s(np.array([0, 8])) == pytest.approx([0.0037, 0.0037 + 8 * 0.00019])
    now = CalibrationRecord.load(load_bundle(bundle), "vllm").frontend
    assert now is not None and now.input_idle_ms == 4.1
    assert now.input_delays_s(np.array([0, 8])) == pytest.approx([0.0041, 0.0026 + 8 * 0.00002])


def test_a_version_12_view_loses_only_the_first_chunk(tmp_path: Path) -> None:
    bundle = current(tmp_path / "profiles")
    lines = tool.older_view(bundle, tmp_path / "view", 12)
    view = tmp_path / "view" / "cpu" / QWEN3_TINY.name
    assert lines[:-1] == [
        WRITES_KEPT,
        DRAINS_KEPT,
        BUSY_IN,
        BUSY_BACK, offsets_line(bundle), IDLE_BACK, STEPS_LINE, IDLE_LINE, SPREAD_KEPT, FIRST_CHUNK
    ]  # fmt: skip
    assert read_json(view / layout.BUNDLE_META)["engine_calibration"] == {"vllm": info(12)}
    assert (view / layout.ENGINE_STEPS).read_bytes() == (bundle / layout.ENGINE_STEPS).read_bytes()
    serving = (bundle / layout.SERVING_STEPS).read_text().splitlines()
    assert (view / layout.SERVING_STEPS).read_text() == without_last_column(serving)
    record = CalibrationRecord.load(load_bundle(view), "vllm")
    assert record.frontend_queue is not None and record.frontend_queue.first_ms == 0.0
    assert CalibrationRecord.load(load_bundle(bundle), "vllm").frontend_queue == FrontEndQueue(
        0.3,
        0.5,
        0.05,
        1.2,
        tuple(IDLE_BACK_SPREAD),
        tuple((int(k), tuple(v)) for k, v in BUSY_BACK_SPREAD.items()),
    )


def test_the_command_prints_what_it_took_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = current(tmp_path / "profiles")
    argv = ["older_view", str(bundle), str(tmp_path / "v10"), "--version", "10"]
    monkeypatch.setattr("sys.argv", argv)
    tool.main()
    printed = capsys.readouterr().out.splitlines()
    assert printed[:10] == [
        WRITES_KEPT, DRAINS_KEPT, BUSY_IN, BUSY_BACK, offsets_line(bundle), IDLE_BACK, STEPS_LINE,
        IDLE_LINE, SPREAD_KEPT,
        FIRST_CHUNK,
    ]  # fmt: skip
    assert printed[10].startswith("12: serving_steps.csv client_sends (")
    assert "11: frontend's input line from 52 replayed requests: the experiments' put back " \
        "(input_ms 3.7 -> 3.0)" in printed  # fmt: skip
    assert "is version 10," in printed[-1]


@pytest.mark.parametrize(
    ("version", "backends", "backend", "message"),
    [
        (6, ("vllm",), None, r"version 6: a view is of 7 to 20"),
        (21, ("vllm",), None, r"version 21: a view is of 7 to 20"),
        (9, ("hf_cb", "vllm"), None, r"meta.json: engine_calibration holds \['hf_cb', 'vllm'\]"),
        (9, ("vllm",), "sglang", r"meta.json: engine_calibration\.sglang\.version: 'missing'"),
    ],
    ids=["too-old", "current", "two-backends", "no-such-backend"],
)
def test_a_view_it_cannot_make_is_refused_by_name(
    tmp_path: Path, version: int, backends: tuple[str, ...], backend: str | None, message: str
) -> None:
    bundle = current(tmp_path / "profiles", backends)
    with pytest.raises(ValueError, match=message):
        tool.older_view(bundle, tmp_path / "view", version, backend)
    assert not (tmp_path / "view").exists()


def test_a_bundle_of_another_version_or_a_view_already_there_is_refused(tmp_path: Path) -> None:
    bundle = current(tmp_path / "profiles")
    tool.older_view(bundle, tmp_path / "view", 11)
    with pytest.raises(FileExistsError, match=r"view/cpu/qwen3_tiny: already there"):
        tool.older_view(bundle, tmp_path / "view", 9)
    older = tmp_path / "view" / "cpu" / QWEN3_TINY.name
    with pytest.raises(ValueError, match=r"meta.json: engine_calibration\.vllm\.version: 11, exp"):
        tool.older_view(older, tmp_path / "again", 9)


def test_a_column_another_backend_fills_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "steps.csv"
    path.write_text("backend,phase,num_prompts\nvllm,prefill,1\nhf_cb,mixed,2\n")
    table = tool.Table.read(path)
    assert table.clear("num_prompts", "vllm") == 1
    table.write()
    assert path.read_text() == "backend,phase,num_prompts\nvllm,prefill,\nhf_cb,mixed,2\n"


def test_a_version_15_view_loses_only_the_idle_way_backs_spread(tmp_path: Path) -> None:
    bundle = current(tmp_path / "profiles")
    lines = tool.older_view(bundle, tmp_path / "view", 15)
    view = tmp_path / "view" / "cpu" / QWEN3_TINY.name
    assert lines[:-1] == [
        WRITES_KEPT, DRAINS_KEPT, BUSY_IN, BUSY_BACK, offsets_line(bundle), IDLE_BACK
    ]  # fmt: skip
    assert read_json(view / layout.BUNDLE_META)["engine_calibration"] == {"vllm": info(15)}
    queue = CalibrationRecord.load(load_bundle(view), "vllm").frontend_queue
    assert queue is not None and queue.first_idle_residual_ms == ()
    assert queue.to_dict() == {k: QUEUE_V13.get(k, 0.0) for k in queue.to_dict()}


def test_a_version_15_view_takes_the_quietest_replays_out(tmp_path: Path) -> None:
    """Version 16 replays at four rates, the quietest for the wake-ups after long idles: a
    version 15 view takes that rate's steps out and keeps the other three rates' as they were."""
    bundle = current(tmp_path / "profiles")
    steps = schedule()
    edges = np.linspace(steps["start_time_s"].min(), steps["end_time_s"].max() + 1e-3, 5)
    windows = [(rate, float(a), float(b)) for rate, a, b in
               zip((2.0, 5.0, 30.0, 60.0), edges[:-1], edges[1:], strict=True)]  # fmt: skip
    replayed = serving_replay.serving_steps(steps, windows, "vllm", [])
    write_csv(bundle / layout.SERVING_STEPS, replayed, SERVING_STEPS_TABLE)
    quiet = int((replayed["rate_qps"] == 2.0).sum())
    assert 0 < quiet < len(replayed)
    lines = tool.older_view(bundle, tmp_path / "view", 15)
    assert lines[:-1] == [
        WRITES_KEPT,
        DRAINS_KEPT,
        BUSY_IN,
        BUSY_BACK,
        IDLE_BACK,  # the replays written here without sends: no offsets to take out
        f"16: serving_steps.csv: the quietest replays (2 req/s, {quiet} steps) taken out; "
        "kept: the front end's readings, fitted with them",
    ]
    view = load_bundle(tmp_path / "view" / "cpu" / QWEN3_TINY.name)
    kept = CalibrationRecord.load(view, "vllm").serving_steps
    assert kept is not None and sorted(set(kept["rate_qps"])) == [5.0, 30.0, 60.0]
    assert len(kept) == len(replayed) - quiet
