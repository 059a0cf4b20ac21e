"""What a replay sends and what it observes: typed request inputs and per-request records.

Backends report observations to a :class:`Recorder` from their own threads; it keeps one
:class:`RequestRecord` per request under a lock. Every time is in seconds from the run's clock
origin (``time.perf_counter()`` at scheduled time 0), the same clock the transformers engine uses
for its own timestamps.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gpu_simulate_test.io.schemas import REQUEST_STATUSES

STATUS_PENDING = "pending"
STATUS_OK = "ok"
STATUS_ERROR = "error"
STATUS_TIMEOUT = "timeout"
STATUS_CANCELLED = "cancelled"
TERMINAL_STATUSES: tuple[str, ...] = REQUEST_STATUSES
"""How a request can end, and what ``request_metrics.csv`` accepts (``io.schemas``)."""


@dataclass(frozen=True)
class BenchRequest:
    """One workload request to replay.

    A multi-turn session's turn >= 1 (``turn`` > 0) is sent by the closed loop
    (:mod:`.closed_loop`): until then its ``scheduled_arrival_s`` is NaN and its
    ``prompt_token_ids`` only its new user message; ``num_prefill_tokens`` is always the whole
    prompt that is sent."""

    request_id: int
    num_prefill_tokens: int
    num_decode_tokens: int
    scheduled_arrival_s: float
    prompt_token_ids: tuple[int, ...] | None = None
    prompt_text: str | None = None
    session_id: int | None = None
    """The request's session (None: an independent request, sent open loop)."""
    turn: int = 0
    """0-based turn within its session."""
    think_time_s: float = 0.0
    """A turn >= 1: seconds after the previous turn's last token before it is sent."""

    @property
    def total_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def closed_loop(self) -> bool:
        """Sent by the closed loop once its previous turn ended (no scheduled arrival of its
        own)."""
        return self.session_id is not None and self.turn > 0


@dataclass
class RequestRecord:
    """What was observed of one request; filled in by the recorder, read by the metric math."""

    request_id: int
    num_prefill_tokens: int
    expected_decode_tokens: int
    scheduled_arrival_s: float
    arrival_s: float | None = None
    """When the harness handed the request to the engine (or started sending it)."""
    event_times_s: list[float] = field(default_factory=list)
    """When the harness observed each output event (one token each for hf backends)."""
    event_num_tokens: list[int] = field(default_factory=list)
    """Tokens carried by each event (a streaming chunk may carry several)."""
    engine_token_times_s: list[float] = field(default_factory=list)
    """The engine's own timestamp of each token, where it gives one."""
    engine_arrival_s: float | None = None
    """When the engine registered the request (transformers ``created_time``; vLLM
    ``queued_ts``, when its scheduler queued it)."""
    engine_scheduled_s: float | None = None
    """When the engine first scheduled it (end of queueing; transformers ``lifespan[0]``, vLLM
    ``scheduled_ts``)."""
    engine_first_token_s: float | None = None
    """The engine's stamp of the first token where it gives no per-token ones (vLLM
    ``first_token_ts``: when its engine core emitted the step's outputs)."""
    engine_last_token_s: float | None = None
    """The same of the last token (vLLM ``last_token_ts``)."""
    reported_decode_tokens: int | None = None
    """Output tokens as the server counted them (``usage.completion_tokens``)."""
    cached_tokens: int | None = None
    """Prompt tokens the server says its prefix cache held (``usage.prompt_tokens_details.
    cached_tokens``); None where it said nothing."""
    engine_cached_tokens: int | None = None
    """The same as the engine's scheduler recorded it (the hit at first admission)."""
    engine: int | None = None
    """The engine of a data-parallel server (``--data-parallel-size``) that queued it; None for
    one engine, or where it reached none."""
    sendable_s: float | None = None
    """A closed-loop turn: when it could first be sent (its previous turn's stream had closed and
    its prompt was built); its ``scheduled_arrival_s`` (the intended send) may be earlier when the
    think time is shorter than the stream's close. None: an open-loop request."""
    status: str = STATUS_PENDING
    error: str = ""

    @property
    def num_decode_tokens(self) -> int:
        """Output tokens produced: the server's count where given, else the events' sum."""
        if self.reported_decode_tokens is not None:
            return self.reported_decode_tokens
        return sum(self.event_num_tokens)

    @property
    def engine_first_token(self) -> float | None:
        """The engine's stamp of the first token: the first per-token stamp where the engine
        gives them, else its own first-token stamp (None: not stamped)."""
        return (
            self.engine_token_times_s[0] if self.engine_token_times_s else self.engine_first_token_s
        )

    @property
    def engine_last_token(self) -> float | None:
        """The same of the last token."""
        return (
            self.engine_token_times_s[-1] if self.engine_token_times_s else self.engine_last_token_s
        )

    @property
    def is_done(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def sent_when_due(self) -> bool:
        """Whether it could be sent at its scheduled time: every open-loop request; a
        closed-loop turn whose prompt was ready by its intended send."""
        return self.sendable_s is None or self.sendable_s <= self.scheduled_arrival_s


class Recorder:
    """Thread-safe store of :class:`RequestRecord`; terminal records ignore later updates."""

    def __init__(self, requests: Sequence[BenchRequest], origin: float = 0.0) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self.origin = origin
        """``perf_counter()`` value of scheduled time 0; set by the replay just before it starts."""
        self.records: dict[int, RequestRecord] = {
            r.request_id: RequestRecord(
                request_id=r.request_id,
                num_prefill_tokens=r.num_prefill_tokens,
                expected_decode_tokens=r.num_decode_tokens,
                scheduled_arrival_s=r.scheduled_arrival_s,
            )
            for r in requests
        }
        self.num_done = 0
        self.num_tokens = 0
        self._closes: queue.SimpleQueue[int] | None = None
        """Ids closed since :meth:`take_closed` (kept only after :meth:`track_closes`): a queue of
        its own, so the closed loop waits for a close without taking the records' lock, which
        the streams hold at every token (a wake-up that waited for it sent late)."""
        self._keep_output_of: set[int] = set()
        self._output_ids: dict[int, tuple[int, ...]] = {}

    def add(self, requests: Sequence[BenchRequest]) -> None:
        """Record more requests (ids not yet recorded), e.g. a second replay on one engine."""
        with self._lock:
            for r in requests:
                if r.request_id in self.records:
                    raise ValueError(f"request id {r.request_id} is already recorded")
                self.records[r.request_id] = RequestRecord(
                    request_id=r.request_id,
                    num_prefill_tokens=r.num_prefill_tokens,
                    expected_decode_tokens=r.num_decode_tokens,
                    scheduled_arrival_s=r.scheduled_arrival_s,
                )

    def rel(self, perf_counter_s: float) -> float:
        """A ``perf_counter()`` reading as seconds from the run origin."""
        return perf_counter_s - self.origin

    def arrived(self, request_id: int, at: float) -> None:
        with self._lock:
            self.records[request_id].arrival_s = self.rel(at)

    def schedule(self, request_id: int, scheduled_s: float, sendable_s: float) -> None:
        """A closed-loop turn's intended send (``scheduled_s``) and when it became sendable,
        both in seconds from the run origin."""
        with self._lock:
            rec = self.records[request_id]
            rec.scheduled_arrival_s = scheduled_s
            rec.sendable_s = sendable_s

    def track_closes(self, keep_output_of: Iterable[int]) -> None:
        """Keep every close for :meth:`take_closed` from now on, and the output token ids of the
        requests ``keep_output_of`` for :meth:`pop_output_ids` (the closed loop's needs)."""
        with self._lock:
            self._closes = queue.SimpleQueue()
            self._keep_output_of = set(keep_output_of)

    def take_closed(self, timeout: float = 0.0) -> list[int]:
        """The ids closed since the last call, waiting up to ``timeout`` seconds for one when
        there are none (only closes wake it, not tokens)."""
        closes = self._closes
        if closes is None:
            raise RuntimeError("take_closed needs track_closes first")
        taken: list[int] = []
        with contextlib.suppress(queue.Empty):
            taken.append(closes.get(timeout=timeout) if timeout > 0 else closes.get_nowait())
            while True:
                taken.append(closes.get_nowait())
        return taken

    def pop_output_ids(self, request_id: int) -> tuple[int, ...] | None:
        """The output token ids a kept request (:meth:`track_closes`) returned; None if none."""
        with self._lock:
            return self._output_ids.pop(request_id, None)

    def record(self, request_id: int) -> RequestRecord:
        """A copy of one record (:meth:`snapshot`'s, for one request)."""
        with self._lock:
            return _copy(self.records[request_id])

    def engine_times(
        self,
        request_id: int,
        arrival: float | None = None,
        scheduled: float | None = None,
        token_times: Sequence[float] = (),
        first_token: float | None = None,
        last_token: float | None = None,
        cached_tokens: int | None = None,
        engine: int | None = None,
    ) -> None:
        """The engine's own stamps (raw ``perf_counter`` values; None or 0: not stamped); token
        times are appended, ``first_token``/``last_token`` are for engines that stamp only those;
        ``cached_tokens``: its prefix-cache hit at admission (None: not recorded); ``engine``:
        the engine of a data-parallel server that served it (None: one engine)."""
        with self._lock:
            rec = self.records[request_id]
            if engine is not None:
                rec.engine = engine
            if cached_tokens is not None:
                rec.engine_cached_tokens = cached_tokens
            if arrival is not None and arrival > 0:
                rec.engine_arrival_s = self.rel(arrival)
            if scheduled is not None and scheduled > 0:
                rec.engine_scheduled_s = self.rel(scheduled)
            if first_token is not None and first_token > 0:
                rec.engine_first_token_s = self.rel(first_token)
            if last_token is not None and last_token > 0:
                rec.engine_last_token_s = self.rel(last_token)
            rec.engine_token_times_s.extend(self.rel(t) for t in token_times)

    def tokens(self, request_id: int, at: float, num_tokens: int = 1) -> None:
        """An output event carrying ``num_tokens`` tokens, observed at ``at`` (perf_counter)."""
        with self._lock:
            rec = self.records[request_id]
            if rec.is_done or num_tokens <= 0:
                return
            rec.event_times_s.append(self.rel(at))
            rec.event_num_tokens.append(num_tokens)
            self.num_tokens += num_tokens
            self._changed.notify_all()

    def finish(
        self,
        request_id: int,
        status: str,
        error: str = "",
        reported_decode_tokens: int | None = None,
        cached_tokens: int | None = None,
        output_token_ids: Sequence[int] | None = None,
    ) -> bool:
        """Close a request; ``ok`` becomes ``error`` when the token count is not the expected one.
        ``reported_decode_tokens`` and ``cached_tokens`` are what the server's usage said,
        ``output_token_ids`` the ids it streamed (kept only where :meth:`track_closes` asked).

        Returns False when the request was already closed (e.g. timed out before the engine
        finished it).
        """
        if status not in TERMINAL_STATUSES:
            raise ValueError(f"unknown request status {status!r}")
        with self._lock:
            rec = self.records[request_id]
            if rec.is_done:
                return False
            if reported_decode_tokens is not None:
                rec.reported_decode_tokens = reported_decode_tokens
            if cached_tokens is not None:
                rec.cached_tokens = cached_tokens
            if status == STATUS_OK and rec.num_decode_tokens != rec.expected_decode_tokens:
                status = STATUS_ERROR
                error = (
                    f"produced {rec.num_decode_tokens} output tokens, "
                    f"expected {rec.expected_decode_tokens}"
                )
            rec.status = status
            rec.error = error
            self.num_done += 1
            if output_token_ids is not None and request_id in self._keep_output_of:
                self._output_ids[request_id] = tuple(output_token_ids)
            if self._closes is not None:
                self._closes.put(request_id)
            self._changed.notify_all()
            return True

    def wait_for_change(self, timeout: float) -> None:
        """Block until a token or completion is recorded, or ``timeout`` passes."""
        with self._changed:
            self._changed.wait(timeout)

    def snapshot(self) -> list[RequestRecord]:
        """Copies of all records, in request order, safe to read while backends keep writing."""
        with self._lock:
            return [_copy(rec) for _, rec in sorted(self.records.items())]

    def in_flight(self) -> list[RequestRecord]:
        """Records that arrived and are not closed yet (live objects; read under no lock)."""
        with self._lock:
            return [r for r in self.records.values() if r.arrival_s is not None and not r.is_done]


def _copy(rec: RequestRecord) -> RequestRecord:
    """A record with lists of its own (safe to read while backends keep writing the original)."""
    return RequestRecord(
        **{
            **vars(rec),
            "event_times_s": list(rec.event_times_s),
            "event_num_tokens": list(rec.event_num_tokens),
            "engine_token_times_s": list(rec.engine_token_times_s),
        }
    )
