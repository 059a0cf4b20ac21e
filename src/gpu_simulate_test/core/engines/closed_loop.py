"""The closed loop of a multi-turn workload's sessions (``workload=multi_turn``) on the replay's
clock: closed within a session, open across sessions.

Each session starts at its scheduled arrival (its turn 0, sent on time as every open-loop send
is, :func:`~gpu_simulate_test.core.engines.harness.replay`). Turn k >= 1 is due ``think_time_s``
after turn k-1's last token reached the client (the workload's and the simulator's definition,
:mod:`gpu_simulate_test.core.traffic.sessions`), and is sent then, or when turn k-1's stream has
closed if that is later (a think time shorter than the stream's close). Its prompt is the
conversation so far, built from what the server actually returned:

    prompt[k] = prompt[k-1] as sent + turn k-1's output token ids + turn k's new user message

(the output ids from vLLM's ``return_token_ids``; the new message is ``prompts.jsonl``'s line),
which is ``num_prefill_tokens`` long exactly when turn k-1 returned ``num_decode_tokens`` ids (as
``ignore_eos`` forces). Per turn k >= 1 the recorder keeps the intended send
(``scheduled_arrival_s``: turn k-1's last token + think time), when it became sendable
(``sendable_s``) and the real send (``arrival_s``). A turn whose previous turn did not end
``ok`` with exactly ``num_decode_tokens`` output ids is never sent: it and its session's later
turns are closed as ``error``, with the reason, without arriving.

One thread sends every request (the replay's), as in the open loop: it waits for the earliest due
send, woken early by any stream that closes (never by tokens), then sleeps and spins the last
stretch exactly as the open loop does (:data:`FINAL_APPROACH_S`).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
import time
from collections.abc import Sequence
from typing import Any

from gpu_simulate_test.core.engines.base import Backend
from gpu_simulate_test.core.engines.harness import (
    POLL_S,
    START_LEAD_S,
    ProgressFn,
    ReplayOutcome,
    Watch,
    cancel_in_flight,
    raise_if_dead,
    spin_window_s,
    wait_until,
)
from gpu_simulate_test.core.engines.records import (
    STATUS_ERROR,
    STATUS_OK,
    BenchRequest,
    Recorder,
    RequestRecord,
)
from gpu_simulate_test.core.metrics import percentiles as pct

FINAL_APPROACH_S = 0.005
"""The last stretch before a send is waited out as the open loop waits (sleep, then spin), not
on the queue of closes: a close in it is taken after the send (a turn due within it, a think
time under this, is sent late and counted as ``due_before_sendable``). Against a vLLM server on
2 cores (``workload=multi_turn``, 89 requests), waking for the send from a timed wait on the
closes left 2-7 sends over 1 ms late and a late-send p99 of 1.6-3.9 ms (5 runs; one session
start 2-3.8 ms late in 4 of them); with this stretch 1 each, p99 0.41 and 0.56 ms (that start
0.02 ms late), as the open loop's 0.27 and 0.42 ms between them."""
NOT_SENT = "not sent"
"""How a turn's error starts when the closed loop did not send it."""
SCHEDULED = (
    "turn 0: its session's arrival in the workload; turn k >= 1: turn k-1's last output token at "
    "the client + think_time_s (sent then, or at turn k-1's stream close if later)"
)
"""What ``scheduled_arrival_time_s`` means in a closed-loop run (``run_meta.json`` ``sessions``)."""


def next_turn(
    turn: BenchRequest,
    previous: BenchRequest,
    sent: Sequence[int],
    record: RequestRecord,
    output: Sequence[int] | None,
) -> BenchRequest | str:
    """``turn`` ready to send after ``previous`` closed (``record``, having sent the prompt
    ``sent`` and returned ``output`` token ids): its whole prompt and its intended send (the last
    token + its think time); or why it cannot be sent (a wrong-length prompt never is)."""
    where = f"session {turn.session_id} turn {previous.turn} (request {previous.request_id})"
    if record.status != STATUS_OK:
        return f"{where} ended {record.status}: {record.error}"
    if output is None:
        return f"{where} returned no output token ids (the server must honour return_token_ids)"
    if len(output) != previous.num_decode_tokens or not record.event_times_s:
        return (
            f"{where} returned {len(output)} output token ids, not its num_decode_tokens "
            f"{previous.num_decode_tokens}: turn {turn.turn}'s prompt would not be the planned one"
        )
    prompt = (*sent, *output, *(turn.prompt_token_ids or ()))
    if len(prompt) != turn.num_prefill_tokens:
        return (
            f"turn {turn.turn} (request {turn.request_id}) would send {len(sent)} + {len(output)} "
            f"+ {len(turn.prompt_token_ids or ())} = {len(prompt)} prompt tokens, not its "
            f"num_prefill_tokens {turn.num_prefill_tokens}"
        )
    return dataclasses.replace(
        turn,
        scheduled_arrival_s=record.event_times_s[-1] + turn.think_time_s,
        prompt_token_ids=prompt,
    )


class SessionLoop:
    """What is due next: session starts at their arrivals, a later turn once its previous turn
    closed. Requests come session by session, each session's turns in order (``load_requests``)."""

    def __init__(self, requests: Sequence[BenchRequest]) -> None:
        self.requests = {r.request_id: r for r in requests}
        self.following: dict[int, BenchRequest] = {}
        """Request id → its session's next turn, until that is scheduled or given up."""
        for before, after in itertools.pairwise(requests):
            if after.closed_loop and (after.session_id, after.turn) == (
                before.session_id,
                before.turn + 1,
            ):
                self.following[before.request_id] = after
        followers = {r.request_id for r in self.following.values()}
        orphans = [r for r in requests if r.closed_loop and r.request_id not in followers]
        if orphans:
            r = orphans[0]
            raise ValueError(
                f"request {r.request_id} is session {r.session_id}'s turn {r.turn} without its "
                "turn before it just ahead (a session's turns come in order, on adjacent rows)"
            )
        self._due = [(r.scheduled_arrival_s, r.request_id) for r in requests if not r.closed_loop]
        heapq.heapify(self._due)
        self._ready: dict[int, BenchRequest] = {}
        self._sent: dict[int, tuple[int, ...]] = {}
        self.open = len(requests)
        """Requests not closed yet (sent or not)."""

    def peek(self) -> BenchRequest | None:
        """The request due next (None: none until a stream closes)."""
        if not self._due:
            return None
        rid = self._due[0][1]
        return self._ready.get(rid) or self.requests[rid]

    def pop(self) -> BenchRequest:
        """Take the request due next, keeping its prompt where its next turn will need it."""
        _, rid = heapq.heappop(self._due)
        req = self._ready.pop(rid, None) or self.requests[rid]
        if rid in self.following:
            self._sent[rid] = req.prompt_token_ids or ()
        return req

    def closed(self, request_id: int, recorder: Recorder, now_s: float) -> list[tuple[int, str]]:
        """The loop's answer to a closed request: its next turn scheduled (recorded as intended
        and sendable at ``now_s``), or that turn and the session's later ones, each with why
        they are not sent (the caller closes them)."""
        self.open -= 1
        turn = self.following.pop(request_id, None)
        if turn is None:
            return []
        built = next_turn(
            turn,
            self.requests[request_id],
            self._sent.pop(request_id, ()),
            recorder.record(request_id),
            recorder.pop_output_ids(request_id),
        )
        if isinstance(built, str):
            lost = [(turn.request_id, f"{NOT_SENT}: {built}")]
            while (later := self.following.pop(lost[-1][0], None)) is not None:
                lost.append(
                    (later.request_id, f"{NOT_SENT}: its session stopped at turn {turn.turn}")
                )
            return lost
        recorder.schedule(turn.request_id, built.scheduled_arrival_s, now_s)
        self._ready[turn.request_id] = built
        heapq.heappush(self._due, (built.scheduled_arrival_s, turn.request_id))
        return []


def replay_sessions(
    backend: Backend,
    requests: Sequence[BenchRequest],
    recorder: Recorder,
    request_timeout_s: float,
    progress: ProgressFn | None = None,
    progress_every_s: float = 0.25,
) -> ReplayOutcome:
    """Run the sessions of ``requests`` (:class:`SessionLoop`) until every request is closed.

    Raises BackendError when the engine dies; on that, on Ctrl-C and on any other exception,
    in-flight requests are closed (``cancelled``) so that what was measured can be written."""
    loop = SessionLoop(requests)
    spin = spin_window_s(backend)
    recorder.track_closes(loop.following)
    started = time.perf_counter()
    recorder.origin = started + START_LEAD_S
    watch = Watch(backend, recorder, request_timeout_s, progress, progress_every_s)
    sent = 0
    wait_s = 0.0
    try:
        while loop.open:
            closed = recorder.take_closed(wait_s)
            now_s = recorder.rel(time.perf_counter())
            for rid in closed:
                for lost, why in loop.closed(rid, recorder, now_s):
                    recorder.finish(lost, STATUS_ERROR, why)
            if not loop.open:
                break
            due = loop.peek()
            remaining = (
                math.inf
                if due is None
                else recorder.origin + due.scheduled_arrival_s - time.perf_counter()
            )
            if remaining <= FINAL_APPROACH_S:
                assert due is not None
                raise_if_dead(backend, recorder)
                wait_until(recorder.origin + due.scheduled_arrival_s, spin)
                backend.submit(loop.pop())
                sent += 1
                wait_s = 0.0
                continue
            if remaining > 2 * POLL_S:  # far from the next send: health, timeouts, progress
                watch.check()
            wait_s = min(POLL_S, remaining - FINAL_APPROACH_S)
    except BaseException as exc:
        cancel_in_flight(recorder, exc)
        raise
    finally:
        if progress is not None:
            progress(recorder)
    return ReplayOutcome(num_sent=sent, wall_time_s=time.perf_counter() - started)


def describe_sessions(
    requests: Sequence[BenchRequest], records: Sequence[RequestRecord]
) -> dict[str, Any]:
    """``run_meta.json``'s ``sessions``: the run was a closed loop, of how many sessions and
    turns, how many were sent and completed, why any was not sent, and how the later turns' sends
    met their intended times (``send_error_ms``: send - intended; ``due_before_sendable``: turns
    whose think time ended before their previous turn's stream closed)."""
    by_id = {r.request_id: r for r in records}
    sessions: dict[int | None, list[RequestRecord]] = {}
    for req in requests:
        sessions.setdefault(req.session_id, []).append(by_id[req.request_id])
    later = [by_id[r.request_id] for r in requests if r.closed_loop]
    sent_later = [r for r in later if r.arrival_s is not None]
    not_sent = [r for r in records if r.arrival_s is None and r.error.startswith(NOT_SENT)]
    turn_of = {r.request_id: r for r in requests}
    turns = pct.describe([len(recs) for recs in sessions.values()])
    errors = pct.describe(
        [r.arrival_s - r.scheduled_arrival_s for r in sent_later if r.arrival_s is not None],
        scale=1e3,
    )
    return {
        "loop": "closed",
        "num_sessions": len(sessions),
        "num_turns": len(requests),
        "turns_per_session": turns.stats(("min", "mean", "max")),
        "sessions_completed": sum(
            all(r.status == STATUS_OK for r in recs) for recs in sessions.values()
        ),
        "turns_sent": sum(
            r.arrival_s is not None for r in by_id.values() if r.request_id in turn_of
        ),
        "turns_not_sent": len(not_sent),
        "not_sent": [
            {
                "request_id": r.request_id,
                "session_id": turn_of[r.request_id].session_id,
                "turn": turn_of[r.request_id].turn,
                "reason": r.error,
            }
            for r in not_sent[:5]
        ],
        "scheduled": SCHEDULED,
        "later_turns_sent": len(sent_later),
        "send_error_ms": errors.stats(("mean", "p50", "p99", "max")),
        "due_before_sendable": sum(not r.sent_when_due for r in sent_later),
    }
