"""Workloads, shared by every stage: sample or import requests (:func:`generate`), write the four
workload artifacts into a run (:func:`write_workload`) and read a workload run back
(:func:`load_workload`). The ``workload`` stage (:mod:`gpu_simulate_test.workload.stage`) is the
command around it."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.config.schema import ConfigError, ModelConfig, WorkloadConfig
from gpu_simulate_test.core.metrics import percentiles as pct
from gpu_simulate_test.core.reporting import progress_bar
from gpu_simulate_test.core.traffic.mooncake import PromptBlocks
from gpu_simulate_test.core.traffic.prefixes import SharedPrefixes, describe, draw_prefixes
from gpu_simulate_test.core.traffic.prompts import (
    exact_text_prompts,
    load_tokenizer,
    random_token_ids,
)
from gpu_simulate_test.core.traffic.sampling import sample_arrivals, sample_lengths
from gpu_simulate_test.core.traffic.sessions import (
    Sessions,
    conversation_prompts,
    draw_sessions,
)
from gpu_simulate_test.core.traffic.sessions import describe as describe_sessions
from gpu_simulate_test.core.traffic.trace import load_trace, trace_arrivals
from gpu_simulate_test.core.traffic.workload_rows import check_rows
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import (
    ArtifactError,
    atomic_open,
    is_finite_number,
    read_csv,
    read_json,
    write_csv,
    write_json,
)
from gpu_simulate_test.io.runs import Run, open_upstream_run
from gpu_simulate_test.io.schemas import TRACE_INTERVALS, TRACE_LENGTHS

WORKLOAD_META_VERSION = "1.0"
PROMPT_WRITE_CHUNK = 4096
LENGTH_STATS: tuple[str, ...] = ("min", "mean", *pct.names((50, 90, 99)), "max")
"""The statistics of each length in the workload summary (percentiles from the one list,
:data:`gpu_simulate_test.core.metrics.percentiles.PERCENTILES`)."""


@dataclass(frozen=True)
class Workload:
    """Lengths and arrival times of every request, in arrival order; prompts are separate.

    ``num_prefill_tokens`` is the whole prompt: with shared prefixes, prefix + own tokens; in a
    session's turn >= 1, the conversation so far. With sessions, rows go session by session and
    ``arrival_time_s`` is NaN on every turn >= 1 (closed loop, :mod:`.sessions`). A Mooncake
    trace's prompts are made of hash-id blocks (``blocks``, :mod:`.mooncake`)."""

    num_prefill_tokens: np.ndarray
    num_decode_tokens: np.ndarray
    arrival_time_s: np.ndarray
    prefixes: SharedPrefixes | None = None
    sessions: Sessions | None = None
    blocks: PromptBlocks | None = None

    @property
    def num_requests(self) -> int:
        return len(self.num_prefill_tokens)

    def fingerprint(self) -> str:
        """Stable id of the requests (lengths and arrivals to the microsecond)."""
        digest = hashlib.sha256()
        digest.update(self.num_prefill_tokens.astype("<i8").tobytes())
        digest.update(self.num_decode_tokens.astype("<i8").tobytes())
        arrival_us = np.rint(np.nan_to_num(self.arrival_time_s, nan=-1e-6) * 1e6)
        digest.update(arrival_us.astype("<i8").tobytes())  # a turn >= 1's empty arrival as -1
        if self.prefixes is not None:  # which requests share a prefix (absent: as before)
            digest.update(self.prefixes.prefix_id.astype("<i8").tobytes())
            digest.update(self.prefixes.request_prefix_len.astype("<i8").tobytes())
        if self.sessions is not None:  # the sessions and their think times (absent: as before)
            for key, values in self.sessions.columns().items():
                scale = 1e6 if key == "think_time_s" else 1
                digest.update(np.rint(values * scale).astype("<i8").tobytes())
        if self.blocks is not None:  # which prompts share which blocks (absent: as before)
            digest.update(self.blocks.digest())
        return "wl-" + digest.hexdigest()[:12]


def generate(cfg: WorkloadConfig, model: ModelConfig) -> tuple[Workload, dict[str, Any]]:
    """Sample (synthetic) or import (trace) the requests; returns them and notes for the meta."""
    streams = [np.random.default_rng(s) for s in np.random.SeedSequence(cfg.seed).spawn(3)]
    if cfg.source != "synthetic":
        return _from_trace(cfg, model, streams[2])
    if cfg.session.enabled:
        return _synthetic_sessions(cfg, model, streams[2]), {}
    max_context = model.max_position_embeddings
    prefill = sample_lengths(cfg.prompt_len, cfg.num_requests, streams[0])
    decode = sample_lengths(cfg.output_len, cfg.num_requests, streams[1])
    prefixes = draw_prefixes(cfg.prefix, cfg.seed, cfg.num_requests)
    if prefixes is not None:
        _check_prefixes_fit(prefixes, model)
        prefill = prefill + prefixes.request_prefix_len
    too_long = np.flatnonzero(prefill + decode > max_context)
    if too_long.size:
        row = int(too_long[0])
        lower = "workload.prefix.len / " if prefixes is not None else ""
        raise ArtifactError(
            f"workload: request {row} has {prefill[row]} prompt + {decode[row]} output tokens, "
            f"over model {model.name}'s max context {max_context}; lower "
            f"{lower}workload.prompt_len.max / workload.output_len.max"
        )
    arrivals = sample_arrivals(cfg.arrival, cfg.num_requests, cfg.qps, streams[2])
    return Workload(prefill, decode, np.asarray(arrivals, dtype=float), prefixes), {}


def _synthetic_sessions(
    cfg: WorkloadConfig, model: ModelConfig, arrival_rng: np.random.Generator
) -> Workload:
    """``workload.num_requests`` sessions arriving at ``workload.qps`` sessions/s, each turn a
    request whose prompt is the conversation so far; a session's prefix, if any, leads turn 0."""
    num_sessions = cfg.num_requests
    sessions, decode = draw_sessions(cfg.session, cfg.output_len, cfg.seed, num_sessions)
    prefixes = draw_prefixes(cfg.prefix, cfg.seed, num_sessions)  # one per session
    first_prefix_len = np.zeros(len(decode), dtype=np.int64)
    if prefixes is not None:
        _check_prefixes_fit(prefixes, model)
        prefixes = replace(prefixes, prefix_id=prefixes.prefix_id[sessions.session_id])
        first_prefix_len = prefixes.request_prefix_len
    prefill = conversation_prompts(sessions, decode, first_prefix_len)
    max_context = model.max_position_embeddings
    too_long = np.flatnonzero(prefill + decode > max_context)
    if too_long.size:
        row = int(too_long[0])
        lower = "workload.prefix.len / " if prefixes is not None else ""
        raise ArtifactError(
            f"workload: session {sessions.session_id[row]} turn {sessions.turn[row]} (request "
            f"{row}) has {prefill[row]} prompt + {decode[row]} output tokens, over model "
            f"{model.name}'s max context {max_context}; lower {lower}workload.session.turns.max "
            "/ workload.session.user_tokens.max / workload.output_len.max"
        )
    starts = sample_arrivals(cfg.arrival, num_sessions, cfg.qps, arrival_rng)
    return Workload(prefill, decode, sessions.per_request(starts), prefixes, sessions)


def _from_trace(
    cfg: WorkloadConfig, model: ModelConfig, arrival_rng: np.random.Generator
) -> tuple[Workload, dict[str, Any]]:
    """The requests of ``workload.trace_file``; a multi-turn trace's rate is sessions/s."""
    assert cfg.trace_file is not None  # checked by WorkloadConfig
    trace = load_trace(
        cfg.trace_file,
        cfg.num_requests,
        model.max_position_embeddings,
        cfg.clip_to_max_context,
        cfg.trace_block_tokens,
    )
    if trace.blocks is not None and cfg.prompt_mode != "token_ids":
        raise ConfigError(
            f"workload.prompt_mode={cfg.prompt_mode}: {cfg.trace_file} is a Mooncake trace, whose "
            "prompts are token ids derived from its hash ids; use workload.prompt_mode=token_ids"
        )
    arrivals, notes = trace_arrivals(trace, cfg, arrival_rng)
    notes.update(
        trace_file=str(cfg.trace_file),
        trace_rows=trace.total_rows,
        clipped_requests=trace.clipped_rows,
    )
    workload = Workload(
        trace.num_prefill_tokens,
        trace.num_decode_tokens,
        arrivals,
        sessions=trace.sessions,
        blocks=trace.blocks,
    )
    return workload, notes


def _check_prefixes_fit(prefixes: SharedPrefixes, model: ModelConfig) -> None:
    """A prefix must leave room in the context for one own token and one output token."""
    longest = int(np.argmax(prefixes.prefix_lengths))
    length = int(prefixes.prefix_lengths[longest])
    if length + 2 > model.max_position_embeddings:
        raise ArtifactError(
            f"workload.prefix.len: prefix {longest} has {length} tokens, leaving no room in model "
            f"{model.name}'s max context {model.max_position_embeddings} for a request's own "
            "token and one output token; lower workload.prefix.len"
        )


def summarize(workload: Workload) -> dict[str, Any]:
    """Counts, duration, achieved request rate and length statistics (:data:`LENGTH_STATS`,
    NaN for a workload without requests). With sessions the duration is the last session's
    arrival and the rate is sessions/s (``mean_sessions_per_s``; ``mean_qps`` None)."""
    arrivals = workload.arrival_time_s[~np.isnan(workload.arrival_time_s)]  # sessions: turn 0s
    duration = float(arrivals[-1]) if arrivals.size else 0.0
    total = workload.num_prefill_tokens + workload.num_decode_tokens
    shared: dict[str, Any] = {}
    if workload.prefixes is not None:
        shared = {
            "total_prefix_tokens": int(workload.prefixes.request_prefix_len.sum()),
            "requests_per_prefix": workload.prefixes.requests_per_prefix(),
        }
    mean_qps = (workload.num_requests - 1) / duration if duration > 0 else None
    if workload.sessions is not None:  # the request rate is the closed loop's: none set here
        mean_qps = None
        shared |= {
            "num_sessions": len(arrivals),
            "mean_sessions_per_s": (len(arrivals) - 1) / duration if duration > 0 else None,
            "total_user_tokens": int(workload.sessions.user_tokens.sum()),
        }
    return {
        "num_requests": workload.num_requests,
        "duration_s": duration,
        "mean_qps": mean_qps,
        "total_prefill_tokens": int(workload.num_prefill_tokens.sum()),
        "total_decode_tokens": int(workload.num_decode_tokens.sum()),
        "num_prefill_tokens": pct.describe(workload.num_prefill_tokens).stats(LENGTH_STATS),
        "num_decode_tokens": pct.describe(workload.num_decode_tokens).stats(LENGTH_STATS),
        "max_total_tokens": int(total.max()) if total.size else 0,
        **shared,
    }


def _write_prompts(
    path: Path, workload: Workload, cfg: WorkloadConfig, model: ModelConfig, show_progress: bool
) -> None:
    """Write ``prompts.jsonl`` in chunks, with a progress bar; atomic like every artifact.

    A request with a shared prefix gets that prefix's tokens (or text) followed by its own, drawn
    from the prompt stream exactly as a request without a prefix would be. A session's turn 0
    is its prefix + its user message; a later turn's line holds its new user message alone (the
    sender adds the conversation so far). A Mooncake trace's prompt is its blocks' tokens."""
    rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, 1]))
    tokenizer = load_tokenizer(cfg.tokenizer_path) if cfg.prompt_mode == "text" else None
    own_lengths, lead = _prompt_parts(workload)
    prefix_prompts: list[Any] = []
    if workload.prefixes is not None:
        if tokenizer is None:
            prefix_prompts = workload.prefixes.token_ids(model.vocab_size)
        else:
            prefix_prompts = workload.prefixes.texts(tokenizer)
    n, vocab = workload.num_requests, model.vocab_size
    with atomic_open(path) as handle, progress_bar("writing prompts", n, show_progress) as advance:
        for start in range(0, n, PROMPT_WRITE_CHUNK):
            stop = min(start + PROMPT_WRITE_CHUNK, n)
            lengths = own_lengths[start:stop]
            lines: list[str] = []
            if tokenizer is None:
                drawn = lengths if workload.blocks is None else np.zeros_like(lengths)
                for offset, ids in enumerate(random_token_ids(drawn, vocab, rng)):
                    i = start + offset
                    if lead[i] >= 0:
                        ids = np.concatenate([prefix_prompts[lead[i]], ids])
                    if workload.blocks is not None:
                        ids = workload.blocks.token_ids(i, int(own_lengths[i]), vocab, cfg.seed)
                    lines.append(
                        f'{{"num_decode_tokens": {workload.num_decode_tokens[i]}, '
                        f'"num_prefill_tokens": {workload.num_prefill_tokens[i]}, '
                        f"{_prefix_keys(workload.prefixes, i)}"
                        f'"prompt_token_ids": [{", ".join(map(str, ids.tolist()))}], '
                        f'"request_id": {i}{_session_keys(workload.sessions, i)}}}\n'
                    )
            else:
                for offset, text in enumerate(exact_text_prompts(lengths.tolist(), tokenizer, rng)):
                    i = start + offset
                    record = _text_record(workload, i, text)
                    if lead[i] >= 0:
                        record["prompt_text"] = _joined_text(
                            prefix_prompts[lead[i]], text, tokenizer, record
                        )
                    lines.append(json.dumps(record, sort_keys=True) + "\n")
            handle.write("".join(lines))
            advance(stop - start)


def _prompt_parts(workload: Workload) -> tuple[np.ndarray, np.ndarray]:
    """Per request, the tokens its line draws from the prompt stream, and the prefix the line
    starts with (-1: none; a session's turn >= 1 holds its new user message alone)."""
    own = workload.num_prefill_tokens
    lead = np.full(workload.num_requests, -1, dtype=np.int64)
    if workload.prefixes is not None:
        own = own - workload.prefixes.request_prefix_len
        lead = workload.prefixes.prefix_id.copy()
    if workload.sessions is not None:
        own = workload.sessions.user_tokens
        lead[workload.sessions.turn > 0] = -1
    return own, lead


def _text_record(workload: Workload, i: int, text: str) -> dict[str, Any]:
    """The ``prompts.jsonl`` record of request ``i`` with a text prompt."""
    record: dict[str, Any] = {
        "num_decode_tokens": int(workload.num_decode_tokens[i]),
        "num_prefill_tokens": int(workload.num_prefill_tokens[i]),
        "prompt_text": text,
        "request_id": i,
    }
    if workload.prefixes is not None:
        record["prefix_id"] = int(workload.prefixes.prefix_id[i])
        record["prefix_len"] = int(workload.prefixes.request_prefix_len[i])
    if workload.sessions is not None:
        record.update(_session_values(workload.sessions, i))
    return record


def _prefix_keys(prefixes: SharedPrefixes | None, i: int) -> str:
    """The ``prefix_id`` and ``prefix_len`` of request ``i``, as JSON members (none without)."""
    if prefixes is None:
        return ""
    return f'"prefix_id": {prefixes.prefix_id[i]}, "prefix_len": {prefixes.request_prefix_len[i]}, '


def _session_values(sessions: Sessions, i: int) -> dict[str, Any]:
    return {
        "session_id": int(sessions.session_id[i]),
        "think_time_s": float(sessions.think_time_s[i]),
        "turn": int(sessions.turn[i]),
        "user_tokens": int(sessions.user_tokens[i]),
    }


def _session_keys(sessions: Sessions | None, i: int) -> str:
    """Request ``i``'s session keys, as JSON members after ``request_id`` (none without)."""
    if sessions is None:
        return ""
    return "".join(
        f", {json.dumps(k)}: {json.dumps(v)}" for k, v in _session_values(sessions, i).items()
    )


def _joined_text(prefix: str, own: str, tokenizer: Any, record: Mapping[str, Any]) -> str:
    """Prefix text + own text, checked to tokenize to exactly the request's prompt length (both
    are one-token words that each start a new token, so the counts add up)."""
    text = prefix + own
    count = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    if count != record["num_prefill_tokens"]:
        raise RuntimeError(
            f"request {record['request_id']}: prefix + own text tokenizes to {count} tokens, "
            f"not {record['num_prefill_tokens']}"
        )
    return text


def write_workload(
    run: Run,
    workload: Workload,
    cfg: WorkloadConfig,
    model: ModelConfig,
    notes: Mapping[str, Any],
    show_progress: bool,
) -> dict[str, Any]:
    """Write the four artifacts into ``run`` and return the workload meta."""
    ids = np.arange(workload.num_requests)
    lengths: dict[str, np.ndarray] = {
        "request_id": ids,
        "num_prefill_tokens": workload.num_prefill_tokens,
        "num_decode_tokens": workload.num_decode_tokens,
    }
    if workload.prefixes is not None:
        lengths["prefix_id"] = workload.prefixes.prefix_id
        lengths["prefix_len"] = workload.prefixes.request_prefix_len
    if workload.sessions is not None:
        lengths.update(workload.sessions.columns())
    if workload.blocks is not None:
        lengths.update(workload.blocks.columns())
    write_csv(run.file(layout.TRACE_LENGTHS), pd.DataFrame(lengths), TRACE_LENGTHS)
    arrivals = workload.arrival_time_s
    if workload.sessions is None:
        gaps = np.diff(arrivals, prepend=arrivals[:1])
    else:  # between session starts; empty where the arrival is (a turn >= 1)
        starts = arrivals[workload.sessions.first_rows]
        gaps = workload.sessions.per_request(np.diff(starts, prepend=starts[:1]))
    write_csv(
        run.file(layout.TRACE_INTERVALS),
        pd.DataFrame({"request_id": ids, "arrival_time_s": arrivals, "inter_arrival_s": gaps}),
        TRACE_INTERVALS,
    )
    _write_prompts(run.file(layout.PROMPTS), workload, cfg, model, show_progress)
    generator = asdict(cfg)
    for key in ("prompt_len", "output_len"):  # only the fields the chosen distribution draws with
        generator[key] = getattr(cfg, key).used()
    drawn: dict[str, Any] = {}
    if workload.prefixes is None:
        del generator["prefix"]  # off: the meta stays as it was before prefixes existed
    else:
        drawn["prefix"] = describe(workload.prefixes, cfg.prefix)
    if not cfg.session.enabled:
        del generator["session"]  # off (or a trace's own): as before sessions existed
    if workload.sessions is not None:
        drawn["session"] = describe_sessions(workload.sessions)
    if workload.blocks is not None:
        drawn["prompt_blocks"] = workload.blocks.describe(workload.num_prefill_tokens)
    meta = {
        "schema_version": WORKLOAD_META_VERSION,
        "workload_id": workload.fingerprint(),
        "source": cfg.source,
        "seed": cfg.seed,
        "generator": generator,
        "model": model.name,
        "max_context": model.max_position_embeddings,
        "prompt_mode": cfg.prompt_mode,
        "summary": summarize(workload),
        **drawn,
        **notes,
    }
    write_json(run.file(layout.WORKLOAD_META), meta)
    return meta


@dataclass(frozen=True)
class LoadedWorkload:
    """A workload run read back through the contract layer (for later stages)."""

    path: Path
    meta: dict[str, Any]
    lengths: pd.DataFrame
    intervals: pd.DataFrame
    sessions: Sessions | None = None
    """A multi-turn workload's sessions (``trace_lengths.csv``'s session columns), checked on
    load; None without them."""

    @property
    def workload_id(self) -> str:
        return str(self.meta["workload_id"])


def load_workload(path: Path | str) -> LoadedWorkload:
    """Read a complete workload run directory; fails clearly on a missing or invalid one."""
    p = Path(path)
    open_upstream_run(p, "workload")
    meta = read_json(p / layout.WORKLOAD_META, required_keys=("workload_id", "summary"))
    lengths = read_csv(p / layout.TRACE_LENGTHS, TRACE_LENGTHS)
    intervals = read_csv(p / layout.TRACE_INTERVALS, TRACE_INTERVALS)
    sessions = check_rows(p, meta, lengths, intervals)
    return LoadedWorkload(p, meta, lengths, intervals, sessions)


def write_workload_arrays(
    root: Path | str,
    run_id: str,
    prefill: Any,
    decode: Any,
    arrival_time_s: Any,
    model: ModelConfig,
) -> Path:
    """A complete ``workload`` run under ``<root>/workload/<run_id>/`` with exactly these
    requests (prompt and output tokens, arrivals in seconds), written as the stage writes one."""
    from gpu_simulate_test.io.runs import start_run

    workload = Workload(
        np.asarray(prefill, dtype=np.int64),
        np.asarray(decode, dtype=np.int64),
        np.asarray(arrival_time_s, dtype=float),
    )
    cfg = WorkloadConfig(num_requests=workload.num_requests)
    with start_run(Path(root), "workload", run_id, {"workload_arrays": run_id}) as run:
        write_workload(run, workload, cfg, model, {}, show_progress=False)
    return run.path


def told_rate(workload: Mapping[str, Any]) -> float | None:
    """The rate a workload run was told to send at, as ``vllm bench serve``'s ``request_rate``
    means it (``--request-rate``): a synthetic workload's ``qps``, a trace's
    ``trace_target_qps``; where it was told none (a trace as recorded, chat sessions, whose
    ``qps`` counts sessions) or an infinite one, the rate its arrivals realized."""
    generator = workload.get("generator") or {}
    realized = (workload.get("summary") or {}).get("mean_qps")
    session = generator.get("session") or {}
    told = None
    if generator.get("source") == "synthetic" and not session.get("enabled"):
        told = generator.get("qps")
    elif generator.get("source") == "trace":
        told = generator.get("trace_target_qps")
    if is_finite_number(told):
        return float(told)
    return None if realized is None else float(realized)
