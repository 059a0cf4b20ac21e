"""The workload stage end to end, run as a user runs it (``python -m ...cli.workload``)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_simulate_test.core.traffic.prompts import load_tokenizer
from gpu_simulate_test.core.traffic.requests import load_requests
from gpu_simulate_test.core.traffic.workloads import load_workload
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import ArtifactError, read_json
from tests.conftest import SPLITWISE_TRACE, run_cli

pytestmark = pytest.mark.integration

ARTIFACTS = {
    layout.PROMPTS,
    layout.TRACE_LENGTHS,
    layout.TRACE_INTERVALS,
    layout.WORKLOAD_META,
    layout.RUN_META,
}


def assert_same_artifacts(run_a: Path, run_b: Path) -> None:
    """Two workload runs wrote the same bytes in every artifact but the run's own record."""
    for name in sorted(ARTIFACTS - {layout.RUN_META}):
        assert (run_a / name).read_bytes() == (run_b / name).read_bytes(), name


def test_default_run_writes_the_four_artifacts(tmp_path: Path) -> None:
    proc = run_cli("workload", "output.run_id=demo", cwd=tmp_path)
    run = tmp_path / "tmp" / "workload" / "demo"
    assert {p.name for p in run.iterdir()} == ARTIFACTS
    assert "requests" in proc.stdout and "tmp/workload/demo" in proc.stdout
    loaded = load_workload(run)
    assert len(loaded.lengths) == 64 and loaded.meta["source"] == "synthetic"
    prompts = [json.loads(line) for line in (run / layout.PROMPTS).read_text().splitlines()]
    assert [p["request_id"] for p in prompts] == list(range(64))
    for prompt, (_, row) in zip(prompts, loaded.lengths.iterrows(), strict=True):
        assert (
            len(prompt["prompt_token_ids"])
            == prompt["num_prefill_tokens"]
            == row["num_prefill_tokens"]
        )
        assert prompt["num_decode_tokens"] == row["num_decode_tokens"]
        assert max(prompt["prompt_token_ids"]) < 151643  # no special tokens
    meta = read_json(run / layout.RUN_META)
    assert meta["status"] == "complete" and meta["config"]["workload"]["num_requests"] == 64
    assert meta["workload_id"] == loaded.workload_id


def test_same_seed_same_bytes_other_seed_other_workload(tmp_path: Path) -> None:
    for run_id, seed in (("a", 3), ("b", 3), ("c", 4)):
        run_cli(
            "workload",
            f"output.run_id={run_id}",
            f"workload.seed={seed}",
            "progress=false",
            cwd=tmp_path,
        )
    root = tmp_path / "tmp" / "workload"
    assert_same_artifacts(root / "a", root / "b")
    assert (root / "a" / layout.TRACE_LENGTHS).read_bytes() != (
        root / "c" / layout.TRACE_LENGTHS
    ).read_bytes()
    assert load_workload(root / "a").workload_id != load_workload(root / "c").workload_id


def test_multirun_over_qps_writes_one_run_per_value(tmp_path: Path) -> None:
    run_cli(
        "workload",
        "-m",
        "workload.qps=1,2,4",
        "workload.num_requests=400",
        "output.run_id=q",
        "progress=false",
        cwd=tmp_path,
    )
    rates = [
        load_workload(tmp_path / "tmp" / "workload" / f"q-{i}").meta["summary"]["mean_qps"]
        for i in range(3)
    ]
    assert rates[0] == pytest.approx(1, rel=0.15)
    assert rates[1] == pytest.approx(2, rel=0.15)
    assert rates[2] == pytest.approx(4, rel=0.15)


def test_splitwise_trace_import_with_first_n_and_rescale(tmp_path: Path) -> None:
    run_cli(
        "workload",
        "workload=trace",
        f"workload.trace_file={SPLITWISE_TRACE}",
        "workload.num_requests=300",
        "workload.trace_target_qps=5",
        "model=qwen3_0_6b",
        "output.run_id=sw",
        "progress=false",
        cwd=tmp_path,
    )
    loaded = load_workload(tmp_path / "tmp" / "workload" / "sw")
    assert len(loaded.lengths) == 300
    assert loaded.lengths["num_prefill_tokens"].tolist()[:2] == [374, 396]
    assert loaded.meta["summary"]["mean_qps"] == pytest.approx(5.0)
    assert loaded.meta["arrivals_from"] == "trace" and loaded.meta["trace_rows"] == 19366


def test_text_prompts_tokenize_to_exact_lengths(tmp_path: Path) -> None:
    run_cli(
        "workload",
        "workload.prompt_mode=text",
        "workload.num_requests=6",
        "output.run_id=text",
        "progress=false",
        cwd=tmp_path,
    )
    tokenizer = load_tokenizer(None)
    lines = (tmp_path / "tmp" / "workload" / "text" / layout.PROMPTS).read_text().splitlines()
    assert len(lines) == 6  # one prompt a request
    for line in lines:
        record = json.loads(line)
        ids = tokenizer(record["prompt_text"], add_special_tokens=False)["input_ids"]
        assert len(ids) == record["num_prefill_tokens"]


def test_bad_input_exits_2_naming_the_problem_and_writes_nothing(tmp_path: Path) -> None:
    proc = run_cli(
        "workload",
        "workload=trace",
        "workload.trace_file=missing.csv",
        "output.run_id=x",
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 2
    assert "missing.csv: file does not exist" in proc.stdout
    assert not (tmp_path / "tmp" / "workload" / "x").exists()


@pytest.mark.parametrize("stage", ["pipeline", "capacity", "fidelity", "tune"])
def test_a_chained_stage_refuses_a_missing_trace_creating_nothing(
    tmp_path: Path, stage: str
) -> None:
    # the pipeline left a failed run behind, which then refused the corrected command with the
    # same run id ("already exists; nothing was run", 2026-12-07)
    for _ in range(2):
        proc = run_cli(
            stage, "workload=trace", "workload.trace_file=missing.csv", "output.run_id=x",
            cwd=tmp_path, check=False,
        )  # fmt: skip
        assert proc.returncode == 2 and "missing.csv: file does not exist" in proc.stdout
    assert not (tmp_path / "tmp").exists() or not list((tmp_path / "tmp").rglob("run_meta.json"))
    proc = run_cli(
        "workload",
        "workload.prompt_len.max=4090",
        "workload.prompt_len.min=4090",
        "output.run_id=y",
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 2 and "max context 4096" in proc.stdout
    assert not (tmp_path / "tmp" / "workload" / "y").exists()


def test_existing_run_is_not_overwritten(tmp_path: Path) -> None:
    run_cli("workload", "output.run_id=keep", "progress=false", cwd=tmp_path)
    before = (tmp_path / "tmp" / "workload" / "keep" / layout.TRACE_LENGTHS).read_bytes()
    proc = run_cli("workload", "output.run_id=keep", "workload.seed=9", cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "already exists" in proc.stdout
    assert (tmp_path / "tmp" / "workload" / "keep" / layout.TRACE_LENGTHS).read_bytes() == before


def test_load_workload_refuses_a_tampered_run(tmp_path: Path) -> None:
    run_cli("workload", "output.run_id=t", "progress=false", cwd=tmp_path)
    run = tmp_path / "tmp" / "workload" / "t"
    (run / layout.TRACE_LENGTHS).write_text("request_id,num_prefill_tokens\n0,5\n")
    with pytest.raises(
        ArtifactError, match=r"trace_lengths\.csv: missing required column\(s\) num_decode_tokens"
    ):
        load_workload(run)


def test_console_script_runs_the_stage_from_any_directory(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "gst-workload"
    if not script.exists():
        pytest.skip("the project is not installed with its console scripts")
    proc = subprocess.run(
        [str(script), "output.run_id=cs", "progress=false"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert load_workload(tmp_path / "tmp" / "workload" / "cs").meta["summary"]["num_requests"] == 64


@pytest.mark.parametrize(
    ("files", "overrides", "message"),
    [
        (
            {"binary.csv": b"num_prefill_tokens,num_decode_tokens\n5,3\n\xff\xfe,3\n"},
            ["workload=trace", "workload.trace_file=binary.csv"],
            "binary.csv, line 3: not UTF-8 text (byte 0xff); expected a trace CSV",
        ),
        (
            {"extra.csv": b"arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,3\n0.5,10,5,7\n"},
            ["workload=trace", "workload.trace_file=extra.csv"],
            "extra.csv: not a valid CSV (Expected 3 fields in line 3, saw 4)",
        ),
        (
            {},
            ["workload.output_len.min=100"],
            "workload.output_len.max (64) must be >= workload.output_len.min (100)",
        ),
        ({}, ["workload.seed=-1"], "workload.seed must be >= 0, got -1"),
        (  # a target rate cannot stretch arrivals that have no time span
            {"same.csv": b"arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,3\n0,6,3\n"},
            ["workload=trace", "workload.trace_file=same.csv", "workload.trace_target_qps=5"],
            "workload.trace_target_qps=5: same.csv (trace): its 2 arrivals all fall at one instant",
        ),
        (
            {"one.csv": b"arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,3\n"},
            ["workload=trace", "workload.trace_file=one.csv", "workload.trace_target_qps=5"],
            "one.csv (trace): one request has no arrival rate to set",
        ),
        (  # a long path with brackets: not wrapped, and not taken for rich markup
            {},
            ["workload=trace", f"workload.trace_file='{'long-directory-name/' * 6}[v2]/t.csv'"],
            f"workload.trace_file={'long-directory-name/' * 6}[v2]/t.csv: file does not exist",
        ),
    ],
)
def test_malformed_input_exits_2_with_one_error_naming_it(
    tmp_path: Path, files: dict[str, bytes], overrides: list[str], message: str
) -> None:
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    proc = run_cli("workload", *overrides, "output.run_id=bad", cwd=tmp_path, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    # one error line however long, not wrapped at the terminal width; no traceback
    assert proc.stdout.startswith("error:") and proc.stdout.strip().count("\n") == 0
    assert message in proc.stdout and "Traceback" not in proc.stderr
    assert not (tmp_path / "tmp" / "workload" / "bad").exists()


DEFAULT_WORKLOAD_SHA256 = {
    # the default workload as built before shared prefixes existed: it must stay byte-identical
    layout.PROMPTS: "48d4cbae3a9fad66389a836845d9f403f1dbbb8d84ad5d42135e51b600d1a8bf",
    layout.TRACE_LENGTHS: "0eb3ac27d26fe1b73d904d260dba2f4aa646ed2a41fe94d9bda67f659cc5be33",
}


def test_default_workload_is_unchanged_by_shared_prefixes(tmp_path: Path) -> None:
    run_cli("workload", "output.run_id=d", "progress=false", cwd=tmp_path)
    run = tmp_path / "tmp" / "workload" / "d"
    for name, digest in DEFAULT_WORKLOAD_SHA256.items():
        assert hashlib.sha256((run / name).read_bytes()).hexdigest() == digest, name
    loaded = load_workload(run)
    assert loaded.workload_id == "wl-bd7d8237c62a"
    assert "prefix" not in loaded.meta and "prefix" not in loaded.meta["generator"]
    assert list(loaded.lengths.columns) == ["request_id", "num_prefill_tokens", "num_decode_tokens"]


def _prompt_records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / layout.PROMPTS).read_text().splitlines()]


def test_shared_prefix_preset_shares_leading_tokens(tmp_path: Path) -> None:
    for run_id in ("a", "b"):
        run_cli("workload", "workload=shared_prefix", f"output.run_id={run_id}", cwd=tmp_path)
    root = tmp_path / "tmp" / "workload"
    assert_same_artifacts(root / "a", root / "b")
    loaded = load_workload(root / "a")
    lengths = loaded.lengths
    assert len(lengths) == 48 and set(lengths["prefix_id"]) == {0, 1, 2, 3}
    assert (lengths["prefix_len"] == 64).all()
    own = lengths["num_prefill_tokens"] - lengths["prefix_len"]
    assert own.between(8, 32).all()
    prefix = loaded.meta["prefix"]
    assert prefix["num_prefixes"] == 4 and prefix["share"] == "zipf"
    assert prefix["prefix_len_tokens"] == [64] * 4
    counts = lengths["prefix_id"].value_counts().sort_index().tolist()
    assert prefix["requests_per_prefix"] == counts == loaded.meta["summary"]["requests_per_prefix"]
    by_prefix: dict[int, list[list[int]]] = {}
    for record, (_, row) in zip(_prompt_records(root / "a"), lengths.iterrows(), strict=True):
        ids = record["prompt_token_ids"]
        assert len(ids) == record["num_prefill_tokens"] == row["num_prefill_tokens"]
        assert (record["prefix_id"], record["prefix_len"]) == (row["prefix_id"], row["prefix_len"])
        by_prefix.setdefault(record["prefix_id"], []).append(ids)
    heads = {k: {tuple(ids[:64]) for ids in group} for k, group in by_prefix.items()}
    assert all(len(h) == 1 for h in heads.values())  # one prefix, the same ids for all its requests
    assert len({next(iter(h)) for h in heads.values()}) == 4  # four different prefixes
    for group in by_prefix.values():  # each request's own tokens are its own
        assert len({tuple(ids[64:]) for ids in group}) == len(group)
    # the real bench reads it as independent requests of the whole prompt length
    requests = load_requests(loaded)
    assert [r.num_prefill_tokens for r in requests] == lengths["num_prefill_tokens"].tolist()


def test_shared_prefix_text_prompts_tokenize_to_exact_lengths(tmp_path: Path) -> None:
    run_cli(
        "workload",
        "workload=shared_prefix",
        "workload.prompt_mode=text",
        "workload.num_requests=8",
        "workload.prefix.num_prefixes=2",
        "workload.prefix.len.kind=uniform",
        "workload.prefix.len.min=20",
        "workload.prefix.len.max=40",
        "output.run_id=text",
        "progress=false",
        cwd=tmp_path,
    )
    tokenizer = load_tokenizer(None)
    texts: dict[int, set[str]] = {}
    records = _prompt_records(tmp_path / "tmp" / "workload" / "text")
    assert len(records) == 8  # one prompt a request
    for record in records:
        ids = tokenizer(record["prompt_text"], add_special_tokens=False)["input_ids"]
        assert len(ids) == record["num_prefill_tokens"] > record["prefix_len"]
        prefix_text = tokenizer.decode(ids[: record["prefix_len"]])
        assert record["prompt_text"].startswith(prefix_text)
        texts.setdefault(record["prefix_id"], set()).add(prefix_text)
    assert len(texts) == 2  # both prefixes
    assert all(len(t) == 1 for t in texts.values())  # the same text for every request sharing it


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["workload.prefix.num_prefixes=-1"], "workload.prefix.num_prefixes must be >= 0"),
        (["workload.prefix.share=pareto"], "workload.prefix.share='pareto' is not one of"),
        (["workload.prefix.zipf_a=0"], "workload.prefix.zipf_a must be > 0, got 0"),
        (["workload.prefix.len.value=0"], "workload.prefix.len.value must be >= 1, got 0"),
        (
            ["workload=trace", "workload.trace_file=t.csv", "workload.prefix.num_prefixes=2"],
            "workload.prefix.num_prefixes=2 needs workload.source=synthetic",
        ),
        (
            ["workload.prefix.len.value=5000", "workload.prefix.len.max=8192"],
            "workload.prefix.len: prefix 0 has 5000 tokens",
        ),
        (  # the prefix fits, but prefix + own + output tokens do not: the request is named
            [
                "workload.prefix.len.value=4000",
                "workload.prompt_len.min=90",
                "workload.prompt_len.max=90",
            ],
            "over model qwen3_tiny's max context 4096; lower workload.prefix.len /",
        ),
    ],
)
def test_bad_prefix_settings_exit_2_naming_the_key(
    tmp_path: Path, overrides: list[str], message: str
) -> None:
    proc = run_cli(
        "workload",
        "workload=shared_prefix",
        *overrides,
        "output.run_id=bad",
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout.startswith("error:") and proc.stdout.strip().count("\n") == 0
    assert message in proc.stdout, proc.stdout
    assert not (tmp_path / "tmp" / "workload" / "bad").exists()


def test_multi_turn_preset_writes_sessions(tmp_path: Path) -> None:
    for run_id in ("a", "b"):
        run_cli("workload", "workload=multi_turn", f"output.run_id={run_id}", cwd=tmp_path)
    root = tmp_path / "tmp" / "workload"
    assert_same_artifacts(root / "a", root / "b")
    loaded = load_workload(root / "a")
    lengths, intervals, sessions = loaded.lengths, loaded.intervals, loaded.sessions
    assert sessions is not None and sessions.num_sessions == 32
    assert list(lengths.columns)[-4:] == ["session_id", "turn", "think_time_s", "user_tokens"]
    assert len(lengths) == loaded.meta["summary"]["num_requests"] == len(sessions.turn)
    later = lengths["turn"] > 0
    assert intervals.loc[later, "arrival_time_s"].isna().all()
    assert intervals.loc[later, "inter_arrival_s"].isna().all()
    assert intervals.loc[~later, "arrival_time_s"].notna().all()
    assert (lengths.loc[~later, "think_time_s"] == 0).all()
    assert lengths.loc[later, "think_time_s"].between(0.5, 2.0).all()
    previous = lengths.shift(1)
    grown = previous["num_prefill_tokens"] + previous["num_decode_tokens"] + lengths["user_tokens"]
    assert (lengths.loc[later, "num_prefill_tokens"] == grown[later]).all()
    meta = loaded.meta
    assert meta["generator"]["session"]["enabled"] is True
    assert meta["session"]["num_sessions"] == meta["summary"]["num_sessions"] == 32
    assert meta["summary"]["mean_qps"] is None and meta["summary"]["mean_sessions_per_s"] > 0
    records = _prompt_records(root / "a")
    system = {tuple(r["prompt_token_ids"][:32]) for r in records if r["turn"] == 0}
    assert len(system) == 1  # one system prefix, at the head of every session's turn 0
    for record, (_, row) in zip(records, lengths.iterrows(), strict=True):
        keys = ("session_id", "turn", "think_time_s", "user_tokens", "num_prefill_tokens")
        assert [record[k] for k in keys] == [row[k] for k in keys]
        # turn 0: the prefix + its message; a later turn: its new message alone
        own = record["num_prefill_tokens"] if record["turn"] == 0 else record["user_tokens"]
        assert len(record["prompt_token_ids"]) == own
    with pytest.raises(ArtifactError, match="a multi-turn workload \\(32 sessions\\)"):
        load_requests(loaded)  # independent requests at scheduled times cannot replay it


def test_multi_turn_trace_round_trip_and_rescale(tmp_path: Path) -> None:
    run_cli("workload", "workload=multi_turn", "output.run_id=gen", "progress=false", cwd=tmp_path)
    generated = load_workload(tmp_path / "tmp" / "workload" / "gen")
    trace = generated.lengths.drop(columns=["request_id", "prefix_id", "prefix_len"])
    trace.insert(0, "arrived_at", generated.intervals["arrival_time_s"])
    trace["session_id"] += 100  # a trace's own ids: renumbered on import
    trace.to_csv(tmp_path / "sessions.csv", index=False)
    for run_id, extra in (("imp", []), ("fast", ["workload.trace_target_qps=4"])):
        run_cli(
            "workload",
            "workload=trace",
            "workload.trace_file=sessions.csv",
            f"output.run_id={run_id}",
            "progress=false",
            *extra,
            cwd=tmp_path,
        )
    imported = load_workload(tmp_path / "tmp" / "workload" / "imp")
    columns = ["num_prefill_tokens", "num_decode_tokens", "session_id", "turn", "user_tokens"]
    assert imported.lengths[columns].equals(generated.lengths[columns])
    assert imported.intervals["arrival_time_s"].equals(generated.intervals["arrival_time_s"])
    assert (
        imported.meta["session"]["num_sessions"] == 32
        and "session" not in imported.meta["generator"]
    )
    records = _prompt_records(tmp_path / "tmp" / "workload" / "imp")
    assert [len(r["prompt_token_ids"]) for r in records if r["turn"] > 0] == (
        imported.lengths.loc[imported.lengths["turn"] > 0, "user_tokens"].tolist()
    )
    fast = load_workload(tmp_path / "tmp" / "workload" / "fast")
    assert fast.meta["summary"]["mean_sessions_per_s"] == pytest.approx(4.0)
    assert (
        fast.intervals["arrival_time_s"].isna().equals(imported.intervals["arrival_time_s"].isna())
    )


def test_multi_turn_text_prompts_tokenize_to_their_lengths(tmp_path: Path) -> None:
    run_cli(
        "workload",
        "workload=multi_turn",
        "workload.prompt_mode=text",
        "workload.num_requests=4",
        "output.run_id=text",
        "progress=false",
        cwd=tmp_path,
    )
    tokenizer = load_tokenizer(None)
    records = _prompt_records(tmp_path / "tmp" / "workload" / "text")
    assert {r["turn"] for r in records} >= {0, 1}
    for record in records:
        count = len(tokenizer(record["prompt_text"], add_special_tokens=False)["input_ids"])
        own = record["num_prefill_tokens"] if record["turn"] == 0 else record["user_tokens"]
        assert count == own


def test_load_workload_checks_the_sessions(tmp_path: Path) -> None:
    run_cli("workload", "workload=multi_turn", "output.run_id=s", "progress=false", cwd=tmp_path)
    run = tmp_path / "tmp" / "workload" / "s"
    lengths_path, intervals_path = run / layout.TRACE_LENGTHS, run / layout.TRACE_INTERVALS
    original = lengths_path.read_text()
    lines = original.splitlines()
    fields = lines[2].split(",")  # request 1: session 0's turn 1
    assert fields[6] == "1"
    fields[1] = str(int(fields[1]) + 1)
    lengths_path.write_text("\n".join([*lines[:2], ",".join(fields), *lines[3:]]) + "\n")
    with pytest.raises(
        ArtifactError, match=r"trace_lengths\.csv: row 2, column 'num_prefill_tokens': session 0"
    ):
        load_workload(run)
    lengths_path.write_text(original)
    lines = intervals_path.read_text().splitlines()
    assert lines[2] == "1,,"
    intervals_path.write_text("\n".join([*lines[:2], "1,0.5,0.5", *lines[3:]]) + "\n")
    with pytest.raises(
        ArtifactError, match=r"trace_intervals\.csv: row 2, column 'arrival_time_s': turn 1 has"
    ):
        load_workload(run)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            [
                "workload.source=trace",
                "workload.trace_file=t.csv",
                "workload.prefix.num_prefixes=0",
            ],
            "workload.session.enabled=true generates sessions (workload.source=synthetic)",
        ),
        (["workload.session.turns.min=0"], "workload.session.turns.min must be >= 1, got 0"),
        (
            ["workload.session.think_time.min_s=-1"],
            "workload.session.think_time.min_s must be >= 0, got -1",
        ),
        (
            ["workload.session.think_time.kind=gamma"],
            "workload.session.think_time.kind='gamma' is not one of",
        ),
        (
            ["workload.session.user_tokens.min=4000", "workload.session.user_tokens.max=4000"],
            "workload: session 0 turn 1 (request 1) has",
        ),
    ],
)
def test_bad_session_settings_exit_2_naming_the_key(
    tmp_path: Path, overrides: list[str], message: str
) -> None:
    proc = run_cli(
        "workload",
        "workload=multi_turn",
        *overrides,
        "output.run_id=bad",
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout.startswith("error:") and proc.stdout.strip().count("\n") == 0
    assert message in proc.stdout, proc.stdout
    assert not (tmp_path / "tmp" / "workload" / "bad").exists()
