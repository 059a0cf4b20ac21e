"""The engine loop the profiler watches: ``hf_generate``-style prefill + greedy decode steps.

One request at a time, batch 1: a prefill forward over the prompt (logits of the last position
only, as ``generate`` does) gives the first token, then ``num_decode_tokens - 1`` decode steps
with the KV cache. Each step is wrapped in a push/pop NVTX range (``prefill``/``decode``, on
CUDA when the ``nvtx`` package is there) and a ``torch.profiler.record_function`` of the same
name, and timed with ``perf_counter`` after a device synchronize.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from gpu_simulate_test.config.schema import ModelConfig
from gpu_simulate_test.core.engines.records import BenchRequest
from gpu_simulate_test.deep_profile.metrics import StepTiming
from gpu_simulate_test.deep_profile.static_analysis import decode_cost, prefill_cost


def static_dtype(dtype: str, device: str) -> str:
    """The static-analysis dtype name of the run's dtype (``auto``: bf16 on CUDA, fp32 on CPU)."""
    if dtype == "auto":
        return "bfloat16" if device.startswith("cuda") else "float32"
    return dtype


def nvtx_for(device: str, enabled: bool = True) -> Any | None:
    """The ``nvtx`` module when ranges are wanted and can matter (CUDA), else None."""
    if not enabled or not device.startswith("cuda"):
        return None
    try:
        import nvtx
    except ImportError:
        return None
    return nvtx


def _synchronizer(device: str) -> Callable[[], None]:
    if device.startswith("cuda"):
        import torch

        return lambda: torch.cuda.synchronize(device)
    return lambda: None


@contextlib.contextmanager
def nvtx_push_pop(nvtx: Any | None, name: str) -> Iterator[None]:
    """A push/pop NVTX range (what ``ncu --nvtx-include <name>/`` matches); nothing without nvtx."""
    if nvtx is None:
        yield
        return
    with nvtx.annotate(message=name):
        yield


@contextlib.contextmanager
def _labelled(name: str, nvtx: Any | None) -> Iterator[None]:
    from torch.profiler import record_function

    with nvtx_push_pop(nvtx, name), record_function(name):
        yield


def serve_requests(
    model: Any,
    requests: Sequence[BenchRequest],
    model_cfg: ModelConfig,
    *,
    device: str,
    dtype: str,
    nvtx: Any | None = None,
    done: Callable[[], None] = lambda: None,
) -> list[StepTiming]:
    """Serve ``requests`` one by one and return every step's wall time and analytic cost;
    ``done()`` is called after each request, outside its timed steps (a progress bar)."""
    import torch

    sync = _synchronizer(device)
    cost_dtype = static_dtype(dtype, device)
    steps: list[StepTiming] = []
    with torch.inference_mode():
        for req in requests:
            assert req.prompt_token_ids is not None
            prompt_len = req.num_prefill_tokens
            input_ids = torch.tensor([req.prompt_token_ids], device=device)
            sync()
            start = time.perf_counter()
            with _labelled("prefill", nvtx):
                out = model(input_ids=input_ids, use_cache=True, logits_to_keep=1)
                next_token = out.logits[:, -1:].argmax(dim=-1)
                sync()
            elapsed = time.perf_counter() - start
            cost = prefill_cost(model_cfg, prompt_len, dtype=cost_dtype)
            steps.append(
                StepTiming(
                    req.request_id, "prefill", prompt_len, 0, elapsed, cost.flops, cost.bytes_moved
                )
            )
            past = out.past_key_values
            for j in range(req.num_decode_tokens - 1):
                cached = prompt_len + j
                start = time.perf_counter()
                with _labelled("decode", nvtx):
                    out = model(input_ids=next_token, past_key_values=past, use_cache=True)
                    next_token = out.logits[:, -1:].argmax(dim=-1)
                    sync()
                elapsed = time.perf_counter() - start
                past = out.past_key_values
                dcost = decode_cost(model_cfg, cached, dtype=cost_dtype)
                steps.append(
                    StepTiming(
                        req.request_id, "decode", 1, cached, elapsed, dcost.flops, dcost.bytes_moved
                    )
                )
            done()
    return steps
