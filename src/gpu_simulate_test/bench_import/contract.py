"""What the bench_import stage writes.

Importing a result file writes, per run it holds, a ``workload`` run and a ``real_bench`` run
(the shared tables: :mod:`gpu_simulate_test.io.schemas`, nothing of its own) and, into
``tmp/bench_import/<run_id>/``, :data:`IMPORT_MANIFEST`: which runs came from which file and
the metric conventions found in it. Exporting writes :data:`VLLM_RESULT_JSON` there.
"""

from __future__ import annotations

from gpu_simulate_test.io import layout

REQUEST_METRICS_CSV = layout.REQUEST_METRICS
TOKEN_METRICS_CSV = layout.TOKEN_METRICS
IMPORT_MANIFEST = "import.json"
"""``tool``, ``source`` (path, sha256), ``runs`` (per imported run: ``label``, ``workload_dir``,
``real_dir``, ``num_requests``, ``left_out``) and ``conventions`` (each metric as the tool
defines it, and the check made on the file)."""
VLLM_RESULT_JSON = "vllm_bench_serve.json"
"""An exported run in ``vllm bench serve --save-result --save-detailed``'s format."""
REAL_SUMMARY_JSON = "summary.json"
"""The imported real_bench run's summary: ``vllm bench serve``'s keys recomputed from the
imported tables (as a real_bench run's ``summary.json``)."""

IMPORT_MANIFEST_VERSION = "1.0"
FORMATS: tuple[str, ...] = ("auto", "vllm_bench", "guidellm")
"""What ``format=`` accepts: ``auto`` tells the two apart by their keys."""

VLLM_RESULT_HEADER_KEYS: tuple[str, ...] = (
    "date",
    "endpoint_type",
    "backend",
    "label",
    "model_id",
    "tokenizer_id",
    "num_prompts",
    "request_rate",
    "burstiness",
    "max_concurrency",
)
"""The keys ``vllm bench serve`` writes before its results (vLLM 0.32 ``benchmarks/serve.py``)."""
VLLM_RESULT_KEYS: tuple[str, ...] = (
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
    "input_lens",
    "output_lens",
    "ttfts",
    "itls",
    "latencies",
    "start_times",
    "queue_times",
    "generated_texts",
    "errors",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
    "rtfx",
)
"""Its results, in order, then ``mean_/median_/std_/p<q>_<metric>_ms`` per metric."""
VLLM_DETAILED_KEYS: tuple[str, ...] = (
    "input_lens",
    "output_lens",
    "start_times",
    "ttfts",
    "itls",
)
"""Per-request fields an import needs: ``vllm bench serve`` keeps them only with
``--save-detailed``."""
