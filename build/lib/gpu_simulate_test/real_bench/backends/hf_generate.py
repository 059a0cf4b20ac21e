"""``hf_generate``: one request at a time through ``model.generate()`` (Vidur with batch cap 1).

Requests queue up in arrival order; a worker thread serves them one by one with a streamer that
stamps every new token (``min_new_tokens = max_new_tokens = N`` for exact lengths). Queueing
behind earlier requests counts in TTFT, as it would in a server. A request that times out is
stopped by a stopping criterion at its next token.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence
from typing import Any, ClassVar

from gpu_simulate_test.config.real_bench import RealBenchStageConfig
from gpu_simulate_test.core.engines._inprocess import (
    check_in_process,
    describe_model,
    load_model,
    nvtx_module,
)
from gpu_simulate_test.core.engines.base import Backend
from gpu_simulate_test.core.engines.records import (
    STATUS_ERROR,
    STATUS_OK,
    BenchRequest,
    Recorder,
)

_STOP = None


class _TimestampStreamer:
    """A transformers streamer: the first ``put`` is the prompt, each later one new token(s)."""

    def __init__(
        self,
        on_tokens: Any,
        nvtx: Any | None = None,
    ) -> None:
        self.on_tokens = on_tokens
        self.nvtx = nvtx
        self._prompt_seen = False
        self._range: Any = None
        if nvtx is not None:
            self._range = nvtx.start_range(message="prefill")

    def put(self, value: Any) -> None:
        now = time.perf_counter()
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        if self.nvtx is not None and self._range is not None:
            self.nvtx.end_range(self._range)
            self._range = self.nvtx.start_range(message="decode")
        self.on_tokens(now, int(value.numel()))

    def end(self) -> None:
        if self.nvtx is not None and self._range is not None:
            self.nvtx.end_range(self._range)
            self._range = None


class HfGenerateBackend(Backend):
    """Sequential ``generate()`` calls in a worker thread, fed by an arrival-ordered queue."""

    name: ClassVar[str] = "hf_generate"

    def __init__(self, cfg: RealBenchStageConfig) -> None:
        super().__init__(cfg)
        self.model: Any = None
        self.recorder: Recorder | None = None
        self._queue: queue.Queue[BenchRequest | None] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._cancelled: set[int] = set()
        self._abort = threading.Event()
        self._worker_error: str | None = None
        self._closed = False

    def check(self, requests: Sequence[BenchRequest]) -> None:
        check_in_process(self.cfg, requests)

    def start(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.model = load_model(self.cfg)

    def _generate(self, req: BenchRequest, on_tokens: Any) -> None:
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        backend = self

        class _Cancelled(StoppingCriteria):
            def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
                stop = req.request_id in backend._cancelled or backend._abort.is_set()
                return torch.full(
                    (input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device
                )

        assert req.prompt_token_ids is not None
        input_ids = torch.tensor([req.prompt_token_ids], device=self.model.device)
        streamer = _TimestampStreamer(on_tokens, nvtx_module(self.cfg))
        try:
            with torch.inference_mode():
                self.model.generate(
                    input_ids=input_ids,
                    attention_mask=torch.ones_like(input_ids),
                    max_new_tokens=req.num_decode_tokens,
                    min_new_tokens=req.num_decode_tokens,
                    do_sample=False,
                    pad_token_id=0,
                    streamer=streamer,
                    stopping_criteria=StoppingCriteriaList([_Cancelled()]),
                )
        finally:
            streamer.end()

    def warmup(self, requests: Sequence[BenchRequest]) -> None:
        for req in requests:
            self._generate(req, lambda _at, _n: None)
        self._worker = threading.Thread(target=self._serve, name="hf_generate-worker", daemon=True)
        self._worker.start()

    def submit(self, request: BenchRequest) -> None:
        assert self.recorder is not None
        self.recorder.arrived(request.request_id, time.perf_counter())
        self._queue.put(request)

    def _serve(self) -> None:
        assert self.recorder is not None
        recorder = self.recorder
        try:
            while (req := self._queue.get()) is not _STOP:
                if self._abort.is_set():
                    break
                if req.request_id in self._cancelled:
                    continue
                rid = req.request_id
                try:
                    self._generate(req, lambda at, n, rid=rid: recorder.tokens(rid, at, n))
                except Exception as exc:
                    recorder.finish(rid, STATUS_ERROR, f"{type(exc).__name__}: {exc}")
                else:
                    recorder.finish(rid, STATUS_OK)
        except BaseException as exc:  # pragma: no cover - a bug must end the run, not hang it
            self._worker_error = f"worker thread crashed: {type(exc).__name__}: {exc}"

    def cancel(self, request_id: int) -> None:
        self._cancelled.add(request_id)

    def failure(self) -> str | None:
        if self._worker_error:
            return self._worker_error
        if self._worker is None or not self._worker.is_alive():
            return "worker thread is not running"
        return None

    def close(self, abort: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        if abort:
            self._abort.set()
        self._queue.put(_STOP)
        if self._worker is not None:
            self._worker.join(timeout=60)

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "name": self.name,
            "generation": {
                "do_sample": False,
                "min_new_tokens": "num_decode_tokens",
                "max_new_tokens": "num_decode_tokens",
                "batch_size": 1,
            },
        }
        if self.model is not None:
            info.update(describe_model(self.cfg, self.model))
        return info
