"""Mooncake-format traces (``workload=trace`` with a ``.jsonl`` file): parsing, prompts whose
shared hash ids are shared tokens, blocks rescaled to the model, every bad input named by file,
line and field; end to end, the workload stage writes prompts that share exactly their shared
blocks, the real bench reads those same token ids, and the simulator's prefix cache hits exactly
what a cache over those token ids would."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpu_simulate_test.config.registry import to_typed
from gpu_simulate_test.config.schema import ConfigError, WorkloadConfig, WorkloadStageConfig
from gpu_simulate_test.core.traffic.mooncake import (
    MOONCAKE_BLOCK_TOKENS,
    PromptBlocks,
    block_segments,
    block_token_ids,
    is_mooncake,
)
from gpu_simulate_test.core.traffic.requests import load_requests
from gpu_simulate_test.core.traffic.trace import load_trace
from gpu_simulate_test.core.traffic.workloads import generate, load_workload
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import ArtifactError
from gpu_simulate_test.simulator.run import run_v1
from gpu_simulate_test.vidur_simulate.prompt_origins import prompt_segments
from tests.conftest import run_cli
from tests.unit.simulator.test_simulator_library import PARAMS, TokenClock

SAMPLE = Path(__file__).resolve().parents[3] / "data" / "traces" / "mooncake_sample.jsonl"
VOCAB = 151936


def sample_lines() -> list[dict[str, Any]]:
    return [json.loads(line) for line in SAMPLE.read_text().splitlines()]


def write(tmp_path: Path, rows: list[Any], name: str = "trace.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def row(timestamp: Any = 0, input_length: Any = 600, output_length: Any = 8, **kw: Any) -> dict:
    """A Mooncake line; its hash ids one per 512-token block unless given."""
    blocks = -(-input_length // 512) if isinstance(input_length, int) else 1
    return {
        "timestamp": timestamp,
        "input_length": input_length,
        "output_length": output_length,
        "hash_ids": kw.pop("hash_ids", list(range(blocks))),
        **kw,
    }


def test_the_sample_reads_as_written() -> None:
    lines = sample_lines()
    trace = load_trace(SAMPLE, 0, 40960, False)
    assert trace.total_rows == len(lines) == 60 and trace.clipped_rows == 0
    assert trace.num_prefill_tokens.tolist() == [r["input_length"] for r in lines]
    assert trace.num_decode_tokens.tolist() == [r["output_length"] for r in lines]
    assert trace.arrived_at_s is not None
    stamps = np.array([r["timestamp"] for r in lines], dtype=float)
    assert stamps[0] > 0  # rebased to the first request
    assert np.allclose(trace.arrived_at_s, (stamps - stamps[0]) / 1000.0)
    assert trace.blocks is not None and trace.blocks.block_tokens == MOONCAKE_BLOCK_TOKENS
    assert [ids.tolist() for ids in trace.blocks.hash_ids] == [r["hash_ids"] for r in lines]
    # the sample shares: system prompts and conversations' earlier turns
    firsts = [r["hash_ids"][0] for r in lines]
    assert len(set(firsts)) < len(firsts)


def test_the_first_n_are_taken_and_every_line_counted() -> None:
    trace = load_trace(SAMPLE, 7, 40960, False)
    assert len(trace.num_prefill_tokens) == 7 and trace.total_rows == 60
    assert trace.blocks is not None and len(trace.blocks.hash_ids) == 7


def test_a_mooncake_trace_is_known_by_its_suffix_or_its_first_line(tmp_path: Path) -> None:
    assert is_mooncake(SAMPLE)
    other = write(tmp_path, [row()], name="trace.txt")
    assert is_mooncake(other)
    assert load_trace(other, 0, 4096, False).blocks is not None
    csv = tmp_path / "t.csv"
    csv.write_text("num_prefill_tokens,num_decode_tokens\n5,3\n")
    assert not is_mooncake(csv)


def test_equal_hash_ids_give_equal_tokens_and_different_ones_differ() -> None:
    b = 16
    ab_c = block_token_ids(np.array([5, 9, 11]), 3 * b, b, 0, VOCAB)
    ab_d = block_token_ids(np.array([5, 9, 12]), 3 * b, b, 0, VOCAB)
    assert np.array_equal(ab_c[: 2 * b], ab_d[: 2 * b])
    assert not np.array_equal(ab_c[2 * b :], ab_d[2 * b :])
    assert (ab_c[2 * b :] != ab_d[2 * b :]).mean() > 0.9  # unrelated, not one token apart
    other = block_token_ids(np.array([6, 9, 11]), 3 * b, b, 0, VOCAB)
    assert not np.array_equal(other[:b], ab_c[:b])  # a different first block: nothing shared
    # a partial last block is the start of the full one; the same id elsewhere, the same tokens
    partial = block_token_ids(np.array([5, 9, 11]), 2 * b + 5, b, 0, VOCAB)
    assert np.array_equal(partial, ab_c[: 2 * b + 5])
    moved = block_token_ids(np.array([11]), b, b, 0, VOCAB)
    assert np.array_equal(moved, ab_c[2 * b :])
    # another seed, other tokens; every id a regular token
    assert not np.array_equal(block_token_ids(np.array([5]), b, b, 1, VOCAB), ab_c[:b])
    assert int(ab_c.max()) < 151643 and int(ab_c.min()) >= 0
    small = block_token_ids(np.array([5, 9]), 2 * b, b, 0, 1000)
    assert int(small.max()) < 1000


def test_blocks_rescale_to_the_model_and_prompts_with_them(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        [
            row(0, 2574, 299, hash_ids=[0, 1, 2, 3, 4, 5]),  # 80.4 -> 80 tokens: 5 blocks
            row(10, 513, 7, hash_ids=[0, 9]),  # 16.03 -> 16: the partial block rounds away
            row(20, 1, 3, hash_ids=[7]),  # 0.03 -> at least 1 token
            row(30, 1024 + 16, 5, hash_ids=[0, 1, 8]),  # 32.5 -> 33 (halves round up)
        ],
    )
    trace = load_trace(path, 0, 4096, False, block_tokens=16)
    assert trace.num_prefill_tokens.tolist() == [80, 16, 1, 33]
    assert trace.num_decode_tokens.tolist() == [299, 7, 3, 5]  # outputs as in the trace
    assert trace.blocks is not None and trace.blocks.block_tokens == 16
    assert [ids.tolist() for ids in trace.blocks.hash_ids] == [[0, 1, 2, 3, 4], [0], [7], [0, 1, 8]]
    assert trace.arrived_at_s is not None and trace.arrived_at_s.tolist() == [0, 0.01, 0.02, 0.03]
    unscaled = load_trace(path, 0, 4096, False)
    assert unscaled.num_prefill_tokens.tolist() == [2574, 513, 1, 1040]


def test_clipping_keeps_the_blocks_that_still_hold_tokens(tmp_path: Path) -> None:
    path = write(tmp_path, [row(0, 2048, 40, hash_ids=[0, 1, 2, 3])])
    with pytest.raises(ArtifactError, match=r"line 1: prompt \+ output = 64 \+ 40 tokens"):
        load_trace(path, 0, 80, False, block_tokens=16)
    clipped = load_trace(path, 0, 80, True, block_tokens=16)
    assert clipped.num_prefill_tokens.tolist() == [40] and clipped.clipped_rows == 1
    assert clipped.blocks is not None and clipped.blocks.hash_ids[0].tolist() == [0, 1, 2]


MISSING = {"timestamp": 0, "input_length": 5, "output_length": 2}
INT_EXPECTED = "expected an integer >= 1 (tokens), got"
IDS_EXPECTED = "field 'hash_ids': expected a list of integers from 0 to 2**63 - 1"
BAD = [
    (["{not json"], "line 1: not valid JSON"),
    ([row(), "[1, 2]"], "line 2: expected a JSON object, got list"),
    ([MISSING], "line 1: missing field(s) 'hash_ids'"),
    ([row(), row(5, -4, hash_ids=[0])], f"line 2, field 'input_length': {INT_EXPECTED} -4"),
    ([row(output_length=0)], f"line 1, field 'output_length': {INT_EXPECTED} 0"),
    ([row(input_length=2.5, hash_ids=[0])], f"field 'input_length': {INT_EXPECTED} 2.5"),
    ([row(input_length="600", hash_ids=[0])], f"field 'input_length': {INT_EXPECTED} \"600\""),
    ([row(output_length=True)], f"field 'output_length': {INT_EXPECTED} true"),
    ([row(timestamp=-1)], "line 1, field 'timestamp': expected milliseconds, a number >= 0"),
    ([row(timestamp="now")], "field 'timestamp': expected milliseconds"),
    ([row(5), row(4)], "line 2, field 'timestamp': 4 ms is before the previous request's 5 ms"),
    ([row(hash_ids="0 1")], f'line 1, {IDS_EXPECTED}, got "0 1"'),
    ([row(hash_ids=[0, "1"])], IDS_EXPECTED),
    ([row(hash_ids=[0, -1])], IDS_EXPECTED),
    ([row(hash_ids=[0, 1.0])], IDS_EXPECTED),
    ([row(hash_ids=[0, 2**63])], IDS_EXPECTED),
    (
        [row(input_length=600, hash_ids=[0])],
        "line 1, field 'hash_ids': 1 id(s) for input_length 600; expected ceil(600 / 512) = 2",
    ),
    (
        [row(input_length=512, hash_ids=[0, 1])],
        "field 'hash_ids': 2 id(s) for input_length 512; expected ceil(512 / 512) = 1",
    ),
    (["", "  "], "file has no requests"),
]


@pytest.mark.parametrize(("rows", "message"), BAD)
def test_bad_lines_fail_naming_file_line_and_field(
    tmp_path: Path, rows: list[Any], message: str
) -> None:
    path = write(tmp_path, rows)
    with pytest.raises(ArtifactError) as err:
        load_trace(path, 0, 4096, False)
    assert message in str(err.value)
    assert str(path) in str(err.value)


def test_not_utf8_and_missing_files_are_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(json.dumps(row()).encode() + b"\n\xff\xfe\n")
    with pytest.raises(ArtifactError, match=r"bad\.jsonl, line 2: not UTF-8 text"):
        load_trace(path, 0, 4096, False)
    with pytest.raises(ArtifactError, match=r"nope\.jsonl: file does not exist"):
        load_trace(tmp_path / "nope.jsonl", 0, 4096, False)


def test_block_tokens_are_for_mooncake_traces_only(tmp_path: Path) -> None:
    csv = tmp_path / "t.csv"
    csv.write_text("num_prefill_tokens,num_decode_tokens\n5,3\n")
    with pytest.raises(ConfigError, match=r"trace_block_tokens=16 rescales a Mooncake trace"):
        load_trace(csv, 0, 4096, False, block_tokens=16)
    with pytest.raises(ConfigError, match=r"trace_block_tokens must be >= 1, got 0"):
        WorkloadConfig(source="trace", trace_file=str(SAMPLE), trace_block_tokens=0)
    with pytest.raises(ConfigError, match=r"trace_block_tokens=16 .* workload.source=synthetic"):
        WorkloadConfig(trace_block_tokens=16)


def typed(compose_stage: Any, *overrides: str) -> WorkloadStageConfig:
    base = ["workload=trace", f"workload.trace_file={SAMPLE}", "workload.trace_block_tokens=16"]
    return to_typed(compose_stage("workload", [*base, *overrides]), WorkloadStageConfig)


def test_a_mooncake_workload_takes_the_trace_options(compose_stage: Any) -> None:
    cfg = typed(compose_stage, "workload.num_requests=20", "workload.trace_target_qps=4")
    workload, notes = generate(cfg.workload, cfg.model)
    assert workload.num_requests == 20 and workload.blocks is not None
    assert notes["rescaled_to_qps"] == 4 and notes["trace_rows"] == 60
    assert (workload.num_requests - 1) / workload.arrival_time_s[-1] == pytest.approx(4)
    shifted = replace(workload, blocks=PromptBlocks(workload.blocks.hash_ids[::-1], 16))
    assert shifted.fingerprint() != workload.fingerprint()  # the sharing is in the id
    text = typed(compose_stage, "workload.prompt_mode=text")
    with pytest.raises(ConfigError, match=r"prompt_mode=text: .* is a Mooncake trace"):
        generate(text.workload, text.model)


def shared_blocks(a: list[int], b: list[int]) -> int:
    """Leading hash ids two prompts have in common."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def token_cache_hits(prompts: list[tuple[int, ...]], block_size: int) -> int:
    """Prompt tokens a prefix cache over these token ids hits, each request run alone after the
    ones before it, nothing evicted: leading full blocks an earlier prompt had (vLLM's chained
    hash), at most ``(len - 1) // block_size`` of them."""
    seen: set[tuple[int, ...]] = set()
    hits = 0
    for ids in prompts:
        full = len(ids) // block_size
        hit = 0
        while hit < (len(ids) - 1) // block_size and ids[: (hit + 1) * block_size] in seen:
            hit += 1
        hits += hit * block_size
        seen.update(ids[: (j + 1) * block_size] for j in range(full))
    return hits


def test_the_stage_writes_the_sharing_and_the_simulator_sees_it(tmp_path: Path) -> None:
    run_cli(
        "workload",
        "workload=trace",
        f"workload.trace_file={SAMPLE}",
        "workload.trace_block_tokens=16",
        f"output.root={tmp_path}",
        "output.run_id=mc",
        "progress=false",
        cwd=tmp_path,
    )
    loaded = load_workload(tmp_path / "workload" / "mc")
    assert loaded.meta["prompt_blocks"]["block_tokens"] == 16
    assert loaded.meta["prompt_blocks"]["reusable_prompt_tokens"] > 0
    hash_ids = [[int(h) for h in s.split()] for s in loaded.lengths["hash_ids"]]
    lines = [json.loads(x) for x in (loaded.path / layout.PROMPTS).read_text().splitlines()]
    prompts = [tuple(line["prompt_token_ids"]) for line in lines]
    # the real bench sends exactly these ids
    sent = [req.prompt_token_ids for req in load_requests(loaded)]
    assert sent == prompts
    pairs = 0
    for i in range(len(prompts)):
        for j in range(i):
            k = shared_blocks(hash_ids[i], hash_ids[j])
            same = min(16 * k, len(prompts[i]), len(prompts[j]))
            assert prompts[i][:same] == prompts[j][:same]
            if k < min(len(hash_ids[i]), len(hash_ids[j])):  # then a different block
                assert prompts[i][same] != prompts[j][same]
                pairs += k > 0
    assert pairs > 20  # the sample shares prefixes among many pairs
    # the simulator's prefix cache, each request alone: the hits a cache over the ids gives
    prefill = loaded.lengths["num_prefill_tokens"].to_numpy()
    segments = prompt_segments(loaded.lengths, prefill)
    assert segments is not None
    assert segments[1][0] == (("hash_id", hash_ids[1][0]), 16)
    cached = replace(
        PARAMS, enable_prefix_caching=True, num_blocks=4096, max_num_batched_tokens=512
    )
    n = len(prefill)
    result = run_v1(
        cached, TokenClock(), np.arange(n) * 10.0, prefill, np.full(n, 2), segments=segments
    )
    assert result.prefix_cache is not None
    expected = token_cache_hits(prompts, cached.block_size)
    assert expected > 0 and result.prefix_cache["hits"] == expected


def test_block_segments_cover_the_prompt() -> None:
    assert block_segments([4, 5, 6], 16, 40, "own") == [
        (("hash_id", 4), 16),
        (("hash_id", 5), 16),
        (("hash_id", 6), 8),
    ]
    assert block_segments([4, 5], 16, 20, "own") == [(("hash_id", 4), 16), (("hash_id", 5), 4)]
    assert block_segments([4], 16, 20, "own") == [(("hash_id", 4), 16), ("own", 4)]
