"""The static_analysis step: analytic costs of the requests' prefill and decode shapes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from gpu_simulate_test.config.deep_profile import DeepProfileStageConfig
from gpu_simulate_test.io.artifacts import write_csv, write_json
from gpu_simulate_test.deep_profile import files
from gpu_simulate_test.deep_profile.engine import static_dtype
from gpu_simulate_test.deep_profile.peaks import host_peaks
from gpu_simulate_test.deep_profile.report import static_markdown
from gpu_simulate_test.deep_profile.static_analysis import (
    ModelCost,
    cost_table,
    decode_cost,
    kv_cache_bytes_per_token,
    parameter_counts,
    prefill_cost,
    step_roofline,
)
from gpu_simulate_test.core.engines.records import BenchRequest


def lengths_of(
    requests: Sequence[BenchRequest],
    prompt_lens: Sequence[int] = (),
    context_lens: Sequence[int] = (),
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Prompt and decode-context lengths to tabulate: given ones, else those of the requests.

    A request with ``P`` prompt and ``N`` output tokens decodes with ``P`` … ``P + N - 2`` cached
    tokens; the first and last of those are taken.
    """
    prompts = tuple(sorted(set(prompt_lens) or {r.num_prefill_tokens for r in requests}))
    if context_lens:
        return prompts, tuple(sorted(set(context_lens)))
    contexts: set[int] = set()
    for r in requests:
        if r.num_decode_tokens >= 2:
            contexts.update({r.num_prefill_tokens, r.num_prefill_tokens + r.num_decode_tokens - 2})
    return prompts, tuple(sorted(contexts))


def _op_rows(cost: ModelCost) -> list[dict[str, Any]]:
    shape = {
        "phase": cost.phase,
        "new_tokens": cost.new_tokens,
        "cached_tokens": cost.cached_tokens,
    }
    rows = [{**shape, "scope": "layer", **op.to_dict()} for op in cost.layer.ops]
    rows += [{**shape, "scope": "model", **op.to_dict()} for op in cost.outer_ops]
    for row in rows:
        row["op"] = row.pop("name")
    return rows


def run_static_analysis(
    cfg: DeepProfileStageConfig, requests: Sequence[BenchRequest], out: Path
) -> dict[str, Any]:
    """Write the step's CSV/JSON/markdown; returns the JSON document (the report reads it)."""
    opts = cfg.pipeline.static_analysis
    dtype = static_dtype(cfg.dtype, cfg.hardware.device)
    prompts, contexts = lengths_of(requests, opts.prompt_lens, opts.context_lens)
    hardware, peaks = host_peaks(cfg.hardware)  # a CPU's roofline from its measured peaks
    rows = cost_table(
        cfg.model,
        hardware,
        prompt_lens=prompts,
        context_lens=contexts,
        batch_sizes=opts.batch_sizes,
        dtype=dtype,
    )
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / files.STATIC_STEPS_CSV, pd.DataFrame(rows), files.STEP_COSTS)
    shapes = [prefill_cost(cfg.model, p, dtype=dtype) for p in prompts] + [
        decode_cost(cfg.model, c, dtype=dtype) for c in contexts
    ]
    op_rows = [row for cost in shapes for row in _op_rows(cost)]
    write_csv(out / files.STATIC_LAYER_CSV, pd.DataFrame(op_rows), files.LAYER_OPS)
    doc: dict[str, Any] = {
        "schema_version": "1.0",
        "model": cfg.model.name,
        "hardware": cfg.hardware.name,
        "dtype": dtype,
        "peaks": {
            **peaks,
            "peak_tflops": hardware.peak_bf16_tflops,
            "memory_bandwidth_gb_s": hardware.memory_bandwidth_gb_s,
        },
        "parameters": parameter_counts(cfg.model).to_dict(),
        "kv_cache_bytes_per_token": kv_cache_bytes_per_token(cfg.model, dtype),
        "prompt_lens": list(prompts),
        "context_lens": list(contexts),
        "steps": rows,
        "per_layer": {
            f"{c.phase}_{c.new_tokens}_{c.cached_tokens}": {
                **c.layer.to_dict(),
                "roofline": step_roofline(c, hardware).to_dict(),
            }
            for c in shapes
        },
    }
    write_json(out / files.STATIC_JSON, doc)
    (out / files.STATIC_MD).write_text(static_markdown(doc), encoding="utf-8")
    return doc
