"""Workloads, shared by every stage: sample or import requests (:func:`generate`), write the four
workload artifacts into a run (:func:`write_workload`) and read a workload run back
(:func:`load_workload`). The ``workload`` stage (:mod:`gpu_simulate_test.workload.stage`) is the
command around it."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.config.schema import ModelConfig, WorkloadConfig
from gpu_simulate_test.core import percentiles as pct
from gpu_simulate_test.core.prefixes import SharedPrefixes, describe, draw_prefixes
from gpu_simulate_test.core.prompts import exact_text_prompts, load_tokenizer, random_token_ids
from gpu_simulate_test.core.reporting import progress_bar
from gpu_simulate_test.core.sampling import rescale_to_qps, sample_arrivals, sample_lengths
from gpu_simulate_test.core.trace import load_trace
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import (
    ArtifactError,
    atomic_open,
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
:data:`gpu_simulate_test.core.percentiles.PERCENTILES`)."""


@dataclass(frozen=True)
class Workload:
    """Lengths and arrival times of every request, in arrival order; prompts are separate.

    ``num_prefill_tokens`` is the whole prompt: with shared prefixes, prefix + own tokens."""

    num_prefill_tokens: np.ndarray
    num_decode_tokens: np.ndarray
    arrival_time_s: np.ndarray
    prefixes: SharedPrefixes | None = None

    @property
    def num_requests(self) -> int:
        return len(self.num_prefill_tokens)

    def fingerprint(self) -> str:
        """Stable id of the requests (lengths and arrivals to the microsecond)."""
        digest = hashlib.sha256()
        digest.update(self.num_prefill_tokens.astype("<i8").tobytes())
        digest.update(self.num_decode_tokens.astype("<i8").tobytes())
        digest.update(np.rint(self.arrival_time_s * 1e6).astype("<i8").tobytes())
        if self.prefixes is not None:  # which requests share a prefix (absent: as before)
            digest.update(self.prefixes.prefix_id.astype("<i8").tobytes())
            digest.update(self.prefixes.request_prefix_len.astype("<i8").tobytes())
        return "wl-" + digest.hexdigest()[:12]


def generate(cfg: WorkloadConfig, model: ModelConfig) -> tuple[Workload, dict[str, Any]]:
    """Sample (synthetic) or import (trace) the requests; returns them and notes for the meta."""
    streams = [np.random.default_rng(s) for s in np.random.SeedSequence(cfg.seed).spawn(3)]
    notes: dict[str, Any] = {}
    max_context = model.max_position_embeddings
    prefixes: SharedPrefixes | None = None
    if cfg.source == "synthetic":
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
    else:
        assert cfg.trace_file is not None  # checked by WorkloadConfig
        trace = load_trace(cfg.trace_file, cfg.num_requests, max_context, cfg.clip_to_max_context)
        prefill, decode = trace.num_prefill_tokens, trace.num_decode_tokens
        if trace.arrived_at_s is not None:
            arrivals = trace.arrived_at_s - trace.arrived_at_s[0]
            notes["arrivals_from"] = "trace"
        else:
            arrivals = sample_arrivals(cfg.arrival, len(prefill), cfg.qps, streams[2])
            notes["arrivals_from"] = f"generated ({cfg.arrival.process}, qps={cfg.qps})"
        if cfg.trace_target_qps is not None:
            _check_rescalable(arrivals, cfg, str(notes["arrivals_from"]))
            arrivals = rescale_to_qps(arrivals, cfg.trace_target_qps)
            notes["rescaled_to_qps"] = cfg.trace_target_qps
        notes.update(
            trace_file=str(cfg.trace_file),
            trace_rows=trace.total_rows,
            clipped_requests=trace.clipped_rows,
        )
    return Workload(prefill, decode, np.asarray(arrivals, dtype=float), prefixes), notes


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


def _check_rescalable(arrivals: np.ndarray, cfg: WorkloadConfig, arrivals_from: str) -> None:
    """``trace_target_qps`` needs arrivals spread over time: a rate is (N - 1) / span."""
    if len(arrivals) > 1 and float(np.ptp(arrivals)) > 0:
        return
    if len(arrivals) <= 1:
        why = "one request has no arrival rate to set"
    else:
        why = f"its {len(arrivals)} arrivals all fall at one instant, with no time span to stretch"
    fix = (
        "give the trace distinct arrived_at times"
        if arrivals_from == "trace"
        else "set workload.qps to a finite rate"
    )
    raise ArtifactError(
        f"workload.trace_target_qps={cfg.trace_target_qps:g}: {cfg.trace_file} ({arrivals_from}): "
        f"{why}; drop trace_target_qps, or {fix}"
    )


def summarize(workload: Workload) -> dict[str, Any]:
    """Counts, duration, achieved request rate and length statistics (:data:`LENGTH_STATS`,
    NaN for a workload without requests)."""
    duration = float(workload.arrival_time_s[-1]) if workload.num_requests else 0.0
    total = workload.num_prefill_tokens + workload.num_decode_tokens
    shared: dict[str, Any] = {}
    if workload.prefixes is not None:
        shared = {
            "total_prefix_tokens": int(workload.prefixes.request_prefix_len.sum()),
            "requests_per_prefix": workload.prefixes.requests_per_prefix(),
        }
    return {
        "num_requests": workload.num_requests,
        "duration_s": duration,
        "mean_qps": (workload.num_requests - 1) / duration if duration > 0 else None,
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
    from the prompt stream exactly as a request without a prefix would be."""
    rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, 1]))
    tokenizer = load_tokenizer(cfg.tokenizer_path) if cfg.prompt_mode == "text" else None
    prefixes = workload.prefixes
    prefix_prompts: list[Any] = []
    own_lengths = workload.num_prefill_tokens
    if prefixes is not None:
        own_lengths = own_lengths - prefixes.request_prefix_len
        if tokenizer is None:
            prefix_prompts = prefixes.token_ids(model.vocab_size)
        else:
            prefix_prompts = prefixes.texts(tokenizer)
    n = workload.num_requests
    with atomic_open(path) as handle, progress_bar("writing prompts", n, show_progress) as advance:
        for start in range(0, n, PROMPT_WRITE_CHUNK):
            stop = min(start + PROMPT_WRITE_CHUNK, n)
            lengths = own_lengths[start:stop]
            lines: list[str] = []
            if tokenizer is None:
                for offset, ids in enumerate(random_token_ids(lengths, model.vocab_size, rng)):
                    i = start + offset
                    if prefixes is not None:
                        ids = np.concatenate([prefix_prompts[prefixes.prefix_id[i]], ids])
                    lines.append(
                        f'{{"num_decode_tokens": {workload.num_decode_tokens[i]}, '
                        f'"num_prefill_tokens": {workload.num_prefill_tokens[i]}, '
                        f"{_prefix_keys(prefixes, i)}"
                        f'"prompt_token_ids": [{", ".join(map(str, ids.tolist()))}], '
                        f'"request_id": {i}}}\n'
                    )
            else:
                for offset, text in enumerate(exact_text_prompts(lengths.tolist(), tokenizer, rng)):
                    i = start + offset
                    record: dict[str, Any] = {
                        "num_decode_tokens": int(workload.num_decode_tokens[i]),
                        "num_prefill_tokens": int(workload.num_prefill_tokens[i]),
                        "prompt_text": text,
                        "request_id": i,
                    }
                    if prefixes is not None:
                        record["prompt_text"] = _joined_text(
                            prefix_prompts[prefixes.prefix_id[i]], text, tokenizer, record
                        )
                        record["prefix_id"] = int(prefixes.prefix_id[i])
                        record["prefix_len"] = int(prefixes.request_prefix_len[i])
                    lines.append(json.dumps(record, sort_keys=True) + "\n")
            handle.write("".join(lines))
            advance(stop - start)


def _prefix_keys(prefixes: SharedPrefixes | None, i: int) -> str:
    """The ``prefix_id`` and ``prefix_len`` of request ``i``, as JSON members (none without)."""
    if prefixes is None:
        return ""
    return f'"prefix_id": {prefixes.prefix_id[i]}, "prefix_len": {prefixes.request_prefix_len[i]}, '


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
    write_csv(run.file(layout.TRACE_LENGTHS), pd.DataFrame(lengths), TRACE_LENGTHS)
    arrivals = workload.arrival_time_s
    write_csv(
        run.file(layout.TRACE_INTERVALS),
        pd.DataFrame(
            {
                "request_id": ids,
                "arrival_time_s": arrivals,
                "inter_arrival_s": np.diff(arrivals, prepend=arrivals[:1]),
            }
        ),
        TRACE_INTERVALS,
    )
    _write_prompts(run.file(layout.PROMPTS), workload, cfg, model, show_progress)
    generator = asdict(cfg)
    prefix: dict[str, Any] = {}
    if workload.prefixes is None:
        del generator["prefix"]  # off: the meta stays as it was before prefixes existed
    else:
        prefix = {"prefix": describe(workload.prefixes, cfg.prefix)}
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
        **prefix,
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
    if not lengths["request_id"].equals(intervals["request_id"]):
        raise ArtifactError(
            f"{p}: request_id of {layout.TRACE_LENGTHS} and {layout.TRACE_INTERVALS} differ"
        )
    return LoadedWorkload(p, meta, lengths, intervals)
