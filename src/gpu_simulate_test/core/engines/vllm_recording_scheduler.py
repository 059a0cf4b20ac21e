"""vLLM's own V1 scheduler, writing down every step it takes on the engine core's clock.

A vLLM server started with ``--scheduler-cls`` naming :data:`SCHEDULER_CLS` and
``--no-async-scheduling`` (and the record's path in
:data:`~gpu_simulate_test.core.engines.step_record.ENV`) schedules exactly as vLLM's synchronous
:class:`~vllm.v1.core.sched.scheduler.Scheduler` (every decision is the parent's; vLLM's async
default on a GPU, two batches in flight, is served only by its ``AsyncScheduler``) and appends
one JSON line per event to the record, in the engine-core process:

- ``{"q": id, "t": t}``: the engine queued a request (``add_request``);
- ``{"s": t0, "e": t1, "r": [[id, tokens, context, new_tokens, finished], ...], "p": [ids],
  "w": waiting, "n": running, "h": {id: hit}}``: one step: ``t0`` when scheduling began, ``t1``
  when its outputs were made (vLLM's first- and last-token stamps), each scheduled request with
  its tokens, whether vLLM counts it a context (prefill) request, the tokens it emitted and
  whether it finished, the requests preempted while scheduling it, the queue and running set
  after, and (``h``, only in a step that admitted one) the prefix-cache hit of each request
  admitted for the first time: its ``num_computed_tokens`` as it was scheduled, the tokens vLLM
  reports as the request's ``cached_tokens`` (a request resumed after preemption is left out, as
  vLLM leaves it out of its own count).

Every line also carries ``"g"``, the engine's data-parallel rank (``data_parallel_index``; 0 for
one engine): the engines of ``--data-parallel-size N`` each run a scheduler in their own
process and append to the same record.

Times are ``time.monotonic()``, the clock vLLM's own request stamps use. The lines are written
with one ``os.write`` per step on an append-only descriptor, so a server stopped at any moment
leaves whole lines. This module imports vLLM; :mod:`.step_record` reads the record without it.

**One write per step, at its end.** A request's ``q`` line is held and written with the line of
the step that ends next, in the same ``os.write``, never between two steps where the engine core
takes a request in: a write there lets go of the GIL just as vLLM's output thread wakes to send
the last step's tokens, and the engine core then waited for that thread before scheduling. On
this project's CPU host (tiny Qwen3, 62.7 req/s, 2026-12-07) a write in ``add_request`` put
1.1 ms before 38–67% of the steps that took a request in (their pause 0.69–1.11 ms on average,
the others' 0.12–0.14); held to the step's own write, 0.17–0.22 ms, 1–2% of them over 0.8 ms.
The engine we recorded paused there where the one users deploy does not, by a share that
moved from server to server. The step's own write stays at its end, before its outputs are
queued, where the output thread has nothing to send. A request queued after the last step
that ended before the server stopped leaves no ``q`` line (it has no step either; a run reads
only the requests that finished).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from vllm.v1.core.sched.scheduler import Scheduler

from gpu_simulate_test.core.engines.step_record import ENV


class RecordingScheduler(Scheduler):
    """:class:`vllm.v1.core.sched.scheduler.Scheduler`, recording its steps (see the module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        path = os.environ.get(ENV)
        self._gst_fd = (
            os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if path else None
        )
        self._gst_step: dict[str, Any] | None = None
        self._gst_preempted: list[str] = []
        self._gst_queued: list[dict[str, Any]] = []
        parallel = self.vllm_config.parallel_config
        self._gst_engine = int(
            getattr(parallel, "data_parallel_index", parallel.data_parallel_rank) or 0
        )

    def _gst_write(self, *lines: dict[str, Any]) -> None:
        """These lines, whole, in one ``os.write``."""
        if self._gst_fd is not None:
            text = "".join(
                json.dumps({**line, "g": self._gst_engine}, separators=(",", ":")) + "\n"
                for line in lines
            )
            os.write(self._gst_fd, text.encode())

    def add_request(self, request: Any) -> None:
        queued = time.monotonic()
        super().add_request(request)
        if self._gst_fd is not None:  # written with the next step's line (the module's doc)
            self._gst_queued.append({"q": request.request_id, "t": queued})

    def _preempt_request(self, request: Any, timestamp: float, *args: Any, **kwargs: Any) -> None:
        self._gst_preempted.append(request.request_id)
        super()._preempt_request(request, timestamp, *args, **kwargs)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        self._gst_preempted = []
        output = super().schedule(*args, **kwargs)
        if self._gst_fd is not None and output.num_scheduled_tokens:
            new = {r.req_id for r in output.scheduled_new_reqs}
            cached = output.scheduled_cached_reqs
            self._gst_step = {
                "s": started,
                "r": [
                    [rid, n, int(rid in new or cached.is_context_phase(rid))]
                    for rid, n in output.num_scheduled_tokens.items()
                ],
                "p": list(self._gst_preempted),
                "w": len(self.waiting),
                "n": len(self.running),
            }
            hits = {
                r.req_id: r.num_computed_tokens
                for r in output.scheduled_new_reqs
                if self.requests[r.req_id].num_preemptions <= 0  # first admissions only
            }
            if hits:
                self._gst_step["h"] = hits
        return output

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        step, self._gst_step = self._gst_step, None
        if step is not None:
            ended = time.monotonic()
            emitted: dict[str, tuple[int, int]] = {}
            for core_outputs in outputs.values():
                for out in core_outputs.outputs:
                    emitted[out.request_id] = (
                        len(out.new_token_ids),
                        int(out.finish_reason is not None),
                    )
            for row in step["r"]:
                row.extend(emitted.get(row[0], (0, 0)))
            queued, self._gst_queued = self._gst_queued, []
            self._gst_write(*queued, {**step, "e": ended})
        return outputs
