"""``hf_cb``: in-process transformers continuous batching, the engine Vidur's sarathi mirrors.

The manager runs its own generation thread; a collector thread here drains its output queue,
stamping each streamed token as it is observed and keeping the engine's own ``perf_counter``
stamps (``record_timestamps=True``). Exact output lengths: ``eos_token_id=-1`` and
``max_new_tokens=N`` per request (``min_new_tokens`` is ignored in this mode).

Works with transformers >= 5.x (``ContinuousBatchingConfig``); knobs a version lacks are
dropped and listed in the run metadata, never silently.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import threading
import time
from collections.abc import Sequence
from typing import Any, ClassVar

from gpu_simulate_test.config.backends import HfCbBackendConfig, as_engine
from gpu_simulate_test.config.real_bench import RealBenchStageConfig
from gpu_simulate_test.core.engines._inprocess import (
    check_in_process,
    describe_model,
    load_model,
    nvtx_module,
    nvtx_range,
)
from gpu_simulate_test.core.engines.base import Backend, BackendError
from gpu_simulate_test.core.engines.records import (
    STATUS_ERROR,
    STATUS_OK,
    BenchRequest,
    Recorder,
)

WARMUP_PREFIX = "warmup-"
COLLECT_POLL_S = 0.05


def request_key(request_id: int) -> str:
    return f"r{request_id}"


def cb_config_kwargs(cfg: RealBenchStageConfig) -> dict[str, Any]:
    """Our knobs under the names transformers uses (``page_size`` was ``block_size`` before)."""
    b = as_engine(cfg.backend, HfCbBackendConfig)
    kwargs: dict[str, Any] = {
        "num_blocks": b.num_gpu_blocks_override,
        "max_batch_tokens": b.max_num_batched_tokens,
        "max_requests_per_batch": b.max_num_seqs,
        "page_size": b.block_size,
        "allow_block_sharing": b.allow_block_sharing,
        "scheduler_type": "fifo",
    }
    if b.use_cuda_graph is not None:
        kwargs["use_cuda_graph"] = b.use_cuda_graph
    if not cfg.hardware.device.startswith("cuda"):
        kwargs["use_cuda_graph"] = False
    return kwargs


def make_cb_config(cfg: RealBenchStageConfig) -> tuple[Any, dict[str, Any]]:
    """A ``ContinuousBatchingConfig`` with the knobs this transformers version knows.

    Returns it and the knobs it had to drop (name → value), which go into ``run_meta.json``.
    """
    try:
        from transformers import ContinuousBatchingConfig
    except ImportError:  # pragma: no cover - older layouts
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

    wanted = cb_config_kwargs(cfg)
    if dataclasses.is_dataclass(ContinuousBatchingConfig):
        known = {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}
    else:  # pragma: no cover - a plain class
        known = set(inspect.signature(ContinuousBatchingConfig).parameters)
    if "page_size" not in known and "block_size" in known:  # transformers < 5.17
        wanted["block_size"] = wanted.pop("page_size")
    dropped = {k: v for k, v in wanted.items() if k not in known}
    return ContinuousBatchingConfig(**{k: v for k, v in wanted.items() if k in known}), dropped


class HfContinuousBatchingBackend(Backend):
    """transformers continuous batching in this process (FIFO scheduler, chunked prefill)."""

    name: ClassVar[str] = "hf_cb"

    def __init__(self, cfg: RealBenchStageConfig) -> None:
        super().__init__(cfg)
        self.model: Any = None
        self.manager: Any = None
        self.recorder: Recorder | None = None
        self._collector: threading.Thread | None = None
        self._stop_collecting = threading.Event()
        self._seen: dict[str, int] = {}
        self._dropped_knobs: dict[str, Any] = {}
        self._collector_error: str | None = None
        self._closed = False

    # ------------------------------------------------------------------ checks and start-up
    def check(self, requests: Sequence[BenchRequest]) -> None:
        check_in_process(self.cfg, requests)
        b = as_engine(self.cfg.backend, HfCbBackendConfig)
        longest = max(requests, key=lambda r: r.total_tokens)
        blocks = math.ceil(longest.total_tokens / b.block_size)
        if blocks > b.num_gpu_blocks_override:
            raise ValueError(
                f"request {longest.request_id} needs {blocks} KV-cache blocks of "
                f"{b.block_size} tokens ({longest.total_tokens} tokens) but "
                f"backend.num_gpu_blocks_override={b.num_gpu_blocks_override}; raise "
                "backend.num_gpu_blocks_override"
            )

    def start(self, recorder: Recorder) -> None:
        from transformers import GenerationConfig

        self.recorder = recorder
        self.model = load_model(self.cfg)
        generation_config = GenerationConfig(
            do_sample=False, eos_token_id=-1, pad_token_id=0, max_new_tokens=16
        )
        cb_config, self._dropped_knobs = make_cb_config(self.cfg)
        self.manager = self.model.init_continuous_batching(
            generation_config=generation_config, continuous_batching_config=cb_config
        )
        if hasattr(self.manager, "warmup"):
            self.manager.warmup()  # CUDA graphs / compile warm-up; cheap on CPU
        self._wrap_steps_in_nvtx()
        self.manager.start()

    def _wrap_steps_in_nvtx(self) -> None:
        """Name each engine step ``prefill`` (a prompt in the batch) or ``decode`` in NVTX."""
        nvtx = nvtx_module(self.cfg)
        manager = self.manager
        original = getattr(manager, "_generation_step", None)
        if nvtx is None or original is None:
            return

        def step() -> None:
            label = "decode"
            try:
                batch = manager.batch_processor.inputs_and_outputs.requests_in_batch
                # more than one query token: a prompt (chunk); the scheduler has already marked
                # a prompt's last chunk DECODING, so the status cannot tell
                if any(fs.query_length > 1 for fs in batch):
                    label = "prefill"
            except AttributeError:  # internals differ in this transformers version
                label = "step"
            with nvtx_range(nvtx, label):
                original()

        manager._generation_step = step

    def warmup(self, requests: Sequence[BenchRequest]) -> None:
        """Run the warm-up requests to completion before the collector starts."""
        assert self.manager is not None
        pending = set()
        for i, req in enumerate(requests):
            key = f"{WARMUP_PREFIX}{i}"
            self._add(req, key)
            pending.add(key)
        deadline = time.perf_counter() + self.cfg.backend.request_timeout_s
        while pending:
            if time.perf_counter() > deadline:
                raise BackendError(
                    f"warm-up did not finish within {self.cfg.backend.request_timeout_s} s"
                )
            out = self.manager.get_result(timeout=COLLECT_POLL_S)
            if out is None:
                if (why := self.failure()) is not None:
                    raise BackendError(f"engine failed during warm-up: {why}")
                continue
            if out.is_finished():
                if out.error:
                    raise BackendError(f"warm-up request failed: {out.error}")
                pending.discard(out.request_id)
        self._collector = threading.Thread(
            target=self._collect, name="hf_cb-collector", daemon=True
        )
        self._collector.start()

    # ------------------------------------------------------------------ the measured part
    def _add(self, req: BenchRequest, key: str) -> None:
        assert req.prompt_token_ids is not None
        added = self.manager.add_request(
            list(req.prompt_token_ids),
            request_id=key,
            max_new_tokens=req.num_decode_tokens,
            streaming=True,
            record_timestamps=True,
            eos_token_id=-1,
        )
        if added is None:
            raise BackendError(f"the engine refused request {key} (is it stopping?)")

    def submit(self, request: BenchRequest) -> None:
        assert self.recorder is not None
        key = request_key(request.request_id)
        self._seen[key] = 0
        self.recorder.arrived(request.request_id, time.perf_counter())
        try:
            self._add(request, key)
        except BackendError as exc:
            self.recorder.finish(request.request_id, STATUS_ERROR, str(exc))

    def _collect(self) -> None:
        """Drain the engine's output queue until told to stop; one output per token per request."""
        assert self.recorder is not None
        recorder = self.recorder
        get = self.manager.output_router.output_queue.get
        import queue

        try:
            while not self._stop_collecting.is_set():
                try:
                    out = get(timeout=COLLECT_POLL_S)
                except queue.Empty:
                    continue
                seen_at = time.perf_counter()
                key = out.request_id
                if not key.startswith("r") or key not in self._seen:
                    continue
                request_id = int(key[1:])
                count = len(out.generated_tokens)
                new = count - self._seen[key]
                stamps = list(out.timestamps or [])
                recorder.engine_times(
                    request_id,
                    arrival=out.created_time,
                    scheduled=out.lifespan[0] if out.lifespan else None,
                    token_times=stamps[self._seen[key] : count],
                )
                for _ in range(new):
                    recorder.tokens(request_id, seen_at, 1)
                self._seen[key] = count
                if out.is_finished():
                    if out.error:
                        recorder.finish(request_id, STATUS_ERROR, str(out.error))
                    else:
                        recorder.finish(request_id, STATUS_OK)
        except Exception as exc:  # a bug here must end the run, not hang it
            self._collector_error = f"collector thread crashed: {type(exc).__name__}: {exc}"

    def cancel(self, request_id: int) -> None:
        if self.manager is not None:
            self.manager.cancel_request(request_id_key := request_key(request_id))
            self._seen.pop(request_id_key, None)

    def failure(self) -> str | None:
        if self._collector_error:
            return self._collector_error
        if self.manager is None:
            return "engine not started"
        status = getattr(self.manager, "background_thread_status", None)
        fatal = getattr(status, "fatal_error", None)
        if fatal is not None:
            return f"generation thread failed: {fatal}"
        if not self.manager.is_running():
            return "generation thread is not running"
        return None

    def close(self, abort: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop_collecting.set()
        if self._collector is not None:
            self._collector.join(timeout=5)
        if self.manager is not None:
            kwargs: dict[str, Any] = {"block": True, "timeout": 30}
            if abort and "hard_stop" in inspect.signature(self.manager.stop).parameters:
                kwargs["hard_stop"] = True
            if self.manager.is_running():
                self.manager.stop(**kwargs)
            if hasattr(self.manager, "destroy"):
                self.manager.destroy()

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {"name": self.name, "requested": cb_config_kwargs(self.cfg)}
        if self.model is not None:
            info.update(describe_model(self.cfg, self.model))
        if self.manager is not None:
            resolved = self.manager.continuous_batching_config
            info["resolved"] = {
                key: _plain(getattr(resolved, key))
                for key in (
                    "num_blocks",
                    "max_batch_tokens",
                    "max_requests_per_batch",
                    "page_size",
                    "block_size",
                    "allow_block_sharing",
                    "use_async_batching",
                    "use_cuda_graph",
                    "scheduler_type",
                    "max_memory_percent",
                )
                if hasattr(resolved, key)
            }
            info["engine_attn_implementation"] = getattr(
                self.model.config, "_attn_implementation", None
            )
        info["dropped_knobs"] = self._dropped_knobs
        info["generation"] = {"do_sample": False, "eos_token_id": -1, "streaming": True}
        return info


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    return value if isinstance(value, int | float | str | bool | type(None)) else str(value)
