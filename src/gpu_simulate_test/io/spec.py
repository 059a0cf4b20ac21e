"""Render ``specs/data_model.md`` from the declared schemas, so the page never drifts from code."""

from __future__ import annotations

from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import TableSchema
from gpu_simulate_test.io.schemas import ALL_TABLES, PROMPT_RECORD_KEYS

HEADER = """# Data model

Generated from the declared schemas by `python -m gpu_simulate_test.io.spec`;
a test checks this page matches the code. Columns listed are required (in this order); files may
carry more after them. Times are seconds unless a column says otherwise; CSVs have a header row.

Run directory: `tmp/<stage>/<run_id>/`. Every run holds `{run_meta}` and, until it completes,
`{marker}`.
"""

PROMPT_KEYS = ", ".join(f"`{k}`" for k in PROMPT_RECORD_KEYS)
JSON_ARTIFACTS = f"""
## JSON artifacts

### `{layout.RUN_META}` (every stage, schema 1.0)

`schema_version`, `stage`, `run_id`, `status` (`running`, `complete`, `failed`, `interrupted`),
`config` (the resolved Hydra config), `git` (`commit`, `dirty`), `packages` (versions),
`toolkit_version`, `host` (`hostname`, `platform`, `python`, `cpu`, `gpus` from NVML: name, driver,
memory, max clocks), `start_time`, `end_time` (UTC ISO 8601), `wall_time_s`, `error`; stages add
their own keys (the workload stage: `workload_id`, `num_requests`).

### `{layout.PROMPTS}` (workload stage; one JSON object per line, in request order)

{PROMPT_KEYS}, and either `prompt_token_ids` (list of ints, exactly
`num_prefill_tokens` long) or `prompt_text` (a string the Qwen3 tokenizer turns into exactly
`num_prefill_tokens` tokens, no special tokens).

### `{layout.WORKLOAD_META}` (workload stage, schema 1.0)

`schema_version`, `workload_id` (fingerprint of lengths and arrivals), `source` (`synthetic` or
`trace`), `seed`, `generator` (the workload config), `model`, `max_context`, `prompt_mode`,
`summary` (`num_requests`, `duration_s`, `mean_qps`, `total_prefill_tokens`,
`total_decode_tokens`, `max_total_tokens`, and min/mean/p50/p90/p99/max of `num_prefill_tokens`
and `num_decode_tokens`); for traces also `trace_file`, `trace_rows`, `clipped_requests`,
`arrivals_from`, `rescaled_to_qps`.
"""


def declared_tables() -> tuple[TableSchema, ...]:
    """Every declared table: the shared ones here and those each stage declares beside its code."""
    from gpu_simulate_test.analysis import schemas as compare_tables
    from gpu_simulate_test.profiling.deep_profile import files as deep_profile_tables
    from gpu_simulate_test.real_bench.telemetry import TELEMETRY
    from gpu_simulate_test.vidur_ext.bundle import ATTENTION_TABLE, ENGINE_STEPS_TABLE, MLP_TABLE

    return (
        *ALL_TABLES,
        TELEMETRY,
        MLP_TABLE,
        ATTENTION_TABLE,
        ENGINE_STEPS_TABLE,
        compare_tables.COMPARISON_PERCENTILES,
        compare_tables.COMPARISON_REQUESTS,
        compare_tables.COMPARISON_STEPS,
        compare_tables.SWEEP_TABLE,
        deep_profile_tables.OPERATORS,
        deep_profile_tables.STEP_TIMINGS,
        deep_profile_tables.STEP_COSTS,
        deep_profile_tables.LAYER_OPS,
    )


def render() -> str:
    parts = [
        HEADER.format(run_meta=layout.RUN_META, marker=layout.INCOMPLETE_MARKER),
        "\n## Tables\n",
    ]
    for table in declared_tables():
        parts.append(f"\n### `{table.name}` (schema {table.version})\n\n")
        parts.append(f"{table.description}")
        notes = []
        if table.unique:
            notes.append(f"`{table.unique}` is unique")
        if table.sorted_by:
            notes.append(f"sorted by `{table.sorted_by}`")
        parts.append((" " + "; ".join(notes) + ".") if notes else "")
        parts.append("\n\n| column | type | unit | nullable | min | meaning |\n")
        parts.append("| --- | --- | --- | --- | --- | --- |\n")
        for col in table.columns:
            minimum = "" if col.min_value is None else f"{col.min_value:g}"
            allowed = ", ".join(f"`{v}`" for v in col.allowed)
            meaning = f"{col.description}: one of {allowed}" if allowed else col.description
            parts.append(
                f"| `{col.name}` | {col.dtype} | {col.unit} | {'yes' if col.nullable else 'no'} "
                f"| {minimum} | {meaning} |\n"
            )
    parts.append(JSON_ARTIFACTS)
    return "".join(parts)


if __name__ == "__main__":
    print(render(), end="")
