"""Import a Mooncake-format trace (JSONL, one request a line: ``timestamp`` in ms,
``input_length``, ``output_length`` and ``hash_ids``, one id per 512-token block of the prompt,
the last block possibly partial), with clear errors naming the file, the line and the field.

Prompts that share hash ids at the same positions share those blocks: each block's tokens are
derived from its hash id alone (and the workload seed, :meth:`PromptBlocks.token_ids`), so two
requests with hash ids ``[a, b, ...]`` and ``[a, b, ...]`` start with the same ``2 * B`` tokens and
the real engine's prefix cache finds them; the simulator's is told the same blocks
(:func:`block_segments`, from ``trace_lengths.csv``'s ``hash_ids`` and ``block_tokens``).
``workload.trace_block_tokens=B`` rescales the blocks to B tokens each and every prompt by the same
factor ``B / 512`` (a small model's context)."""

from __future__ import annotations

import json
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpu_simulate_test.core.traffic.prompts import regular_token_limit
from gpu_simulate_test.io.artifacts import ArtifactError, not_utf8_error

MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per hash id in Mooncake's published traces (the last block of a prompt may be
shorter: ``len(hash_ids) == ceil(input_length / 512)``)."""
MOONCAKE_FIELDS: tuple[str, ...] = ("timestamp", "input_length", "output_length", "hash_ids")
MOONCAKE_EXPECTED = (
    "a Mooncake trace (JSONL: one object a line with timestamp (ms), input_length, output_length "
    "and hash_ids, one id per 512-token block)"
)
"""What a Mooncake trace should be, for error messages."""
MAX_HASH_ID = 2**63 - 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer, element-wise on uint64 (wrapping): a fixed, well-spread hash."""
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _MIX_1
        z = (z ^ (z >> np.uint64(27))) * _MIX_2
        return z ^ (z >> np.uint64(31))


def block_token_ids(
    hash_ids: np.ndarray, length: int, block_tokens: int, seed: int, vocab_size: int
) -> np.ndarray:
    """The first ``length`` token ids of a prompt made of these blocks: token ``j`` of a block is
    a hash of (``seed``, its hash id, ``j``) into the regular vocabulary, so equal ids give equal
    tokens wherever they occur and a partial block is the start of the full one."""
    position = np.arange(length, dtype=np.int64)
    block = np.asarray(hash_ids, dtype=np.int64)[position // block_tokens].astype(np.uint64)
    key = _mix(block ^ _mix(np.full(1, seed, dtype=np.uint64)))
    token = _mix(key + (position % block_tokens).astype(np.uint64))
    return (token % np.uint64(regular_token_limit(vocab_size))).astype(np.int64)


@dataclass(frozen=True)
class PromptBlocks:
    """Per request (in arrival order), the hash ids of its prompt's blocks, each block
    ``block_tokens`` long (the last one: what is left of the prompt)."""

    hash_ids: tuple[np.ndarray, ...]
    """Per request, its hash ids (int64), covering its prompt: ``ceil(prompt / block_tokens)``
    of them (after rescaling and clipping)."""
    block_tokens: int
    trace_block_tokens: int = MOONCAKE_BLOCK_TOKENS
    """Tokens per block in the trace itself (prompts are rescaled by ``block_tokens / this``)."""

    def token_ids(self, i: int, length: int, vocab_size: int, seed: int) -> np.ndarray:
        """Request ``i``'s prompt: ``length`` token ids (:func:`block_token_ids`)."""
        return block_token_ids(self.hash_ids[i], length, self.block_tokens, seed, vocab_size)

    def columns(self) -> dict[str, Any]:
        """``trace_lengths.csv``'s ``hash_ids`` (space-separated) and ``block_tokens``."""
        return {
            "hash_ids": [" ".join(map(str, ids.tolist())) for ids in self.hash_ids],
            "block_tokens": np.full(len(self.hash_ids), self.block_tokens, dtype=np.int64),
        }

    def digest(self) -> bytes:
        """The block structure, for the workload's fingerprint."""
        text = ";".join(" ".join(map(str, ids.tolist())) for ids in self.hash_ids)
        return f"{self.block_tokens}|{text}".encode()

    def describe(self, prompt_lengths: np.ndarray) -> dict[str, Any]:
        """``workload_meta.json``'s ``prompt_blocks``: the block sizes, how many distinct blocks,
        and the prompt tokens whose blocks an earlier request's prompt already had (the chain of
        hash ids up to and including theirs): what an unbounded prefix cache could reuse."""
        seen: dict[tuple[int, int], int] = {}  # (parent chain, hash id) -> its chain id
        longest: dict[int, int] = {}  # chain id -> the most tokens of it an earlier prompt had
        reusable = 0
        for ids, total in zip(self.hash_ids, prompt_lengths.tolist(), strict=True):
            chain = 0
            mine: list[tuple[int, int]] = []
            for k, hash_id in enumerate(ids.tolist()):
                chain = seen.setdefault((chain, hash_id), len(seen) + 1)
                tokens = min(self.block_tokens, int(total) - k * self.block_tokens)
                reusable += min(tokens, longest.get(chain, 0))
                mine.append((chain, tokens))
            for chain_id, tokens in mine:
                longest[chain_id] = max(longest.get(chain_id, 0), tokens)
        total_tokens = int(prompt_lengths.sum())
        return {
            "block_tokens": self.block_tokens,
            "trace_block_tokens": self.trace_block_tokens,
            "length_scale": self.block_tokens / self.trace_block_tokens,
            "distinct_hash_ids": len({h for ids in self.hash_ids for h in ids.tolist()}),
            "block_refs": int(sum(len(ids) for ids in self.hash_ids)),
            "reusable_prompt_tokens": reusable,
            "reusable_prompt_share": reusable / total_tokens if total_tokens else 0.0,
        }


def block_segments(
    hash_ids: Sequence[int], block_tokens: int, length: int, own: Hashable
) -> list[tuple[Hashable, int]]:
    """A prompt of ``length`` tokens as the simulator's prefix cache sees it
    (:mod:`gpu_simulate_test.simulator.kv_cache`): one segment per block, named by its hash id,
    ``block_tokens`` long but the last; tokens beyond the blocks (none, unless a replay's prompt
    is longer) are the request's own (``own``)."""
    out: list[tuple[Hashable, int]] = []
    start = 0
    for hash_id in hash_ids:
        if start >= length:
            break
        tokens = min(block_tokens, length - start)
        out.append((("hash_id", int(hash_id)), tokens))
        start += tokens
    if start < length:
        out.append((own, length - start))
    return out


def parse_hash_ids(text: Any, where: str) -> list[int]:
    """``trace_lengths.csv``'s ``hash_ids`` cell (space-separated integers) as a list."""
    try:
        return [int(part) for part in str(text).split()]
    except ValueError as exc:
        raise ArtifactError(
            f"{where}: column 'hash_ids': expected space-separated integers, got {text!r}"
        ) from exc


def is_mooncake(path: Path) -> bool:
    """A ``.jsonl`` file, or one whose first non-blank line is a JSON object with ``hash_ids``."""
    if path.suffix.lower() == ".jsonl":
        return True
    try:
        with path.open(encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    first = json.loads(line)
                    return isinstance(first, dict) and "hash_ids" in first
    except (UnicodeDecodeError, json.JSONDecodeError, OSError):
        return False
    return False


@dataclass(frozen=True)
class MooncakeTrace:
    """The requests taken from a Mooncake trace, lengths rescaled (and clipped)."""

    num_prefill_tokens: np.ndarray
    num_decode_tokens: np.ndarray
    arrived_at_s: np.ndarray
    """Seconds from the first request taken (the trace's ``timestamp`` in ms, rebased)."""
    total_rows: int
    clipped_rows: int
    blocks: PromptBlocks


def load_mooncake(
    path: Path,
    max_requests: int,
    max_context: int,
    clip_to_max_context: bool,
    block_tokens: int | None,
) -> MooncakeTrace:
    """Read ``path``, take the first ``max_requests`` requests (0: all), check each line and
    rescale the prompts to ``block_tokens`` per block (None: the trace's 512).

    A prompt becomes ``max(1, round(input_length * block_tokens / 512))`` tokens; its hash ids
    cover that many (a block rounded away is dropped). Prompt + output over ``max_context``
    fails naming the line unless clipping is on: the output first to ``max_context - 1``, then the
    prompt (and its blocks) to what is left."""
    size = MOONCAKE_BLOCK_TOKENS if block_tokens is None else block_tokens
    records, total_rows = _read_records(path, max_requests)
    lines = np.array([r[0] for r in records], dtype=np.int64)
    stamps = np.array([r[1] for r in records], dtype=float)
    prefill = np.array([max(1, (r[2] * size + 256) // 512) for r in records], dtype=np.int64)
    decode = np.array([r[3] for r in records], dtype=np.int64)
    too_long = np.flatnonzero(prefill + decode > max_context)
    if too_long.size and not clip_to_max_context:
        row = int(too_long[0])
        rescaled = "" if block_tokens is None else f" (rescaled to {size}-token blocks)"
        raise ArtifactError(
            f"{path}, line {lines[row]}: prompt + output = {prefill[row]} + {decode[row]} tokens"
            f"{rescaled} exceeds the model's max context {max_context} ({too_long.size} such "
            "request(s)); pass workload.clip_to_max_context=true to clip, or a smaller "
            "workload.trace_block_tokens"
        )
    if too_long.size:
        decode = np.minimum(decode, max_context - 1)
        prefill = np.minimum(prefill, max_context - decode)
    hash_ids = tuple(
        np.asarray(r[4][: -(-int(p) // size)], dtype=np.int64)
        for r, p in zip(records, prefill, strict=True)
    )
    return MooncakeTrace(
        prefill,
        decode,
        (stamps - stamps[0]) / 1000.0,
        total_rows,
        int(too_long.size),
        PromptBlocks(hash_ids, size),
    )


Record = tuple[int, float, int, int, list[int]]
"""A checked line: its number, timestamp (ms), input and output length, hash ids."""


def _read_records(path: Path, max_requests: int) -> tuple[list[Record], int]:
    """The first ``max_requests`` requests (0: all), each checked, and how many the file has."""
    if not path.is_file():
        raise ArtifactError(f"workload.trace_file={path}: file does not exist")
    records: list[Record] = []
    total = 0
    with path.open("rb") as handle:
        for lineno, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise not_utf8_error(path, MOONCAKE_EXPECTED) from exc
            if not line.strip():
                continue
            total += 1
            if max_requests and len(records) >= max_requests:
                continue  # counted, not read
            record = _check_line(path, lineno, line)
            if records and record[1] < records[-1][1]:
                raise ArtifactError(
                    f"{path}, line {lineno}, field 'timestamp': {record[1]:g} ms is before the "
                    f"previous request's {records[-1][1]:g} ms (expected timestamps in order)"
                )
            records.append(record)
    if not records:
        raise ArtifactError(f"{path}: file has no requests (expected {MOONCAKE_EXPECTED})")
    return records, total


def _check_line(path: Path, lineno: int, line: str) -> Record:
    """One line's request, every field checked; errors name the file, line and field."""
    where = f"{path}, line {lineno}"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ArtifactError(
            f"{where}: not valid JSON ({exc.msg} at column {exc.colno}); expected "
            f"{MOONCAKE_EXPECTED}"
        ) from exc
    if not isinstance(obj, dict):
        raise ArtifactError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    missing = [f for f in MOONCAKE_FIELDS if f not in obj]
    if missing:
        raise ArtifactError(
            f"{where}: missing field(s) {', '.join(repr(f) for f in missing)} (expected "
            f"{', '.join(MOONCAKE_FIELDS)})"
        )
    stamp = obj["timestamp"]
    if not _is_number(stamp) or not math.isfinite(stamp) or stamp < 0:
        raise ArtifactError(
            f"{where}, field 'timestamp': expected milliseconds, a number >= 0, got {_short(stamp)}"
        )
    lengths = []
    for field in ("input_length", "output_length"):
        value = obj[field]
        if not _is_int(value) or value < 1:
            raise ArtifactError(
                f"{where}, field {field!r}: expected an integer >= 1 (tokens), got {_short(value)}"
            )
        lengths.append(int(value))
    ids = obj["hash_ids"]
    if not isinstance(ids, list) or not all(_is_int(h) and 0 <= h <= MAX_HASH_ID for h in ids):
        raise ArtifactError(
            f"{where}, field 'hash_ids': expected a list of integers from 0 to 2**63 - 1, got "
            f"{_short(ids)}"
        )
    blocks = -(-lengths[0] // MOONCAKE_BLOCK_TOKENS)
    if len(ids) != blocks:
        raise ArtifactError(
            f"{where}, field 'hash_ids': {len(ids)} id(s) for input_length {lengths[0]}; expected "
            f"ceil({lengths[0]} / {MOONCAKE_BLOCK_TOKENS}) = {blocks} (one per "
            f"{MOONCAKE_BLOCK_TOKENS}-token block, the last one may be partial)"
        )
    return lineno, float(stamp), lengths[0], lengths[1], ids


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _short(value: Any, limit: int = 60) -> str:
    """``value`` as JSON for an error message, cut to ``limit`` characters."""
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
