"""A workload run's requests as the engines replay them: prompts checked against the lengths,
in arrival order, each fitting the model's context. Shared by the real bench, the deep profile
and the pipeline."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gpu_simulate_test.config.schema import ModelConfig
from gpu_simulate_test.core.engines.records import BenchRequest
from gpu_simulate_test.core.traffic.workloads import LoadedWorkload
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import ArtifactError, read_jsonl


def _token_ids(value: Any, where: str) -> tuple[int, ...]:
    """``prompt_token_ids`` as given: a list of non-negative integers, nothing coerced."""
    if not isinstance(value, list):
        raise ArtifactError(
            f"{where}: prompt_token_ids must be a list of integers, got {type(value).__name__}"
        )
    for i, token in enumerate(value):
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise ArtifactError(
                f"{where}: prompt_token_ids[{i}] must be a non-negative integer, got {token!r}"
            )
    return tuple(value)


def load_requests(
    workload: LoadedWorkload, max_requests: int = 0, sessions: bool = False
) -> list[BenchRequest]:
    """The workload's requests in arrival order, with prompts checked against the lengths.

    A multi-turn workload (``workload.sessions``, :mod:`.sessions`) is refused unless the caller
    runs sessions (``sessions``, the real bench's closed loop,
    :mod:`gpu_simulate_test.core.engines.closed_loop`): its requests then come session by session,
    each with its session, turn and think time; a turn >= 1 has no scheduled arrival (NaN) and
    its ``prompt_token_ids`` are its new user message only (``user_tokens`` long), while its
    ``num_prefill_tokens`` is the whole conversation the closed loop sends."""
    if workload.sessions is not None and not sessions:
        raise ArtifactError(
            f"{workload.path}: a multi-turn workload ({workload.sessions.num_sessions} sessions): "
            "a turn >= 1 is sent think_time_s after the previous turn's last token, its prompt "
            "the conversation so far; this replay sends independent requests at scheduled times "
            "and does not run sessions (the real bench's vllm backend does)"
        )
    prompts_path = workload.path / layout.PROMPTS
    prompts = {int(p["request_id"]): p for p in read_jsonl(prompts_path)}
    prefill_of = dict(
        zip(
            workload.lengths["request_id"].tolist(),
            workload.lengths["num_prefill_tokens"].tolist(),
            strict=True,
        )
    )
    decode_of = dict(
        zip(
            workload.lengths["request_id"].tolist(),
            workload.lengths["num_decode_tokens"].tolist(),
            strict=True,
        )
    )
    requests: list[BenchRequest] = []
    ids_in_order = workload.intervals["request_id"].tolist()
    arrivals = workload.intervals["arrival_time_s"].tolist()
    turn_of = _session_turns(workload)
    for rid_value, arrival in zip(ids_in_order, arrivals, strict=True):
        rid = int(rid_value)
        if rid not in prompts:
            raise ArtifactError(f"{prompts_path}: no prompt for request_id {rid}")
        prompt = prompts[rid]
        prefill = int(prefill_of[rid])
        ids = prompt.get("prompt_token_ids")
        text = prompt.get("prompt_text")
        if ids is None and text is None:
            raise ArtifactError(
                f"{prompts_path}: request {rid} has neither prompt_token_ids nor prompt_text"
            )
        if ids is not None:
            ids = _token_ids(ids, f"{prompts_path}: request {rid}")
        if text is not None and not isinstance(text, str):
            raise ArtifactError(
                f"{prompts_path}: request {rid}: prompt_text must be a string, got "
                f"{type(text).__name__}"
            )
        session_id, turn, think_s, own = turn_of.get(rid, (None, 0, 0.0, prefill))
        if ids is not None and len(ids) != own:
            whose = "trace_lengths says" if own == prefill else "its turn's user_tokens is"
            raise ArtifactError(
                f"{prompts_path}: request {rid} has {len(ids)} prompt token ids but {whose} {own}"
            )
        requests.append(
            BenchRequest(
                request_id=rid,
                num_prefill_tokens=prefill,
                num_decode_tokens=int(decode_of[rid]),
                scheduled_arrival_s=float(arrival),
                prompt_token_ids=ids,
                prompt_text=text,
                session_id=session_id,
                turn=turn,
                think_time_s=think_s,
            )
        )
    if max_requests:
        requests = requests[:max_requests]
    if not requests:
        raise ArtifactError(f"{workload.path}: the workload has no requests")
    return requests


def _session_turns(workload: LoadedWorkload) -> dict[int, tuple[int | None, int, float, int]]:
    """Per request of a multi-turn workload: its session, turn, think time and the length of its
    ``prompt_token_ids`` line (turn 0: the whole prompt; later: the user message); empty
    without sessions."""
    sessions = workload.sessions
    if sessions is None:
        return {}
    prefill = workload.lengths["num_prefill_tokens"].to_numpy()
    own = [int(n) for n in np.where(sessions.turn == 0, prefill, sessions.user_tokens)]
    return {
        int(rid): (int(sid), int(turn), float(think), length)
        for rid, sid, turn, think, length in zip(
            workload.lengths["request_id"].tolist(),
            sessions.session_id.tolist(),
            sessions.turn.tolist(),
            sessions.think_time_s.tolist(),
            own,
            strict=True,
        )
    }


def check_context(requests: Sequence[BenchRequest], model: ModelConfig) -> None:
    """Every request must fit the model's context (prompt + output)."""
    limit = model.max_position_embeddings
    for req in requests:
        if req.total_tokens > limit:
            raise ValueError(
                f"request {req.request_id} needs {req.num_prefill_tokens} prompt + "
                f"{req.num_decode_tokens} output = {req.total_tokens} tokens, over model "
                f"{model.name}'s context of {limit} tokens; use a workload built for this model"
            )
