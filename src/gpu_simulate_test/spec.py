"""Render ``specs/data_model.md`` from the declared schemas, so the page never drifts from code."""

from __future__ import annotations

from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import TableSchema
from gpu_simulate_test.io.schemas import ALL_TABLES, PROMPT_RECORD_KEYS

HEADER = """# Data model

Generated from the declared schemas by `python -m gpu_simulate_test.spec`;
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
`num_prefill_tokens` tokens, no special tokens). A workload with shared prefixes
(`workload.prefix`) adds `prefix_id` and `prefix_len`: the prompt starts with that prefix's
`prefix_len` token ids (or text), the same for every request with that `prefix_id`. A
multi-turn workload (`workload.session`, or a trace with session columns) adds `session_id`,
`turn`, `think_time_s` and `user_tokens` (as in `trace_lengths.csv`); a turn >= 1's
`prompt_token_ids` (or `prompt_text`) is its new user message alone, `user_tokens` long: the
sender sends the previous turn's prompt + its output + this message, `num_prefill_tokens` in all.
A Mooncake trace's `prompt_token_ids` are its blocks' tokens (`hash_ids` and `block_tokens` in
`trace_lengths.csv`), each block's derived from its hash id and the workload seed: prompts with
equal hash ids at the same positions start with the same tokens.

### `{layout.WORKLOAD_META}` (workload stage, schema 1.0)

`schema_version`, `workload_id` (fingerprint of lengths and arrivals), `source` (`synthetic`,
`trace`, or the tool an imported run came from: `vllm_bench_serve`, `guidellm`), `seed`,
`generator` (the workload config; its `prompt_len` and `output_len` with only the fields their
`kind` draws with, its `prefix` only when prefixes are on, its `session` only when
`workload.session.enabled`), `model`,
`max_context`, `prompt_mode`, `summary` (`num_requests`, `duration_s`, `mean_qps`,
`total_prefill_tokens`, `total_decode_tokens`, `max_total_tokens`, and min/mean/p50/p90/p99/max
of `num_prefill_tokens` and `num_decode_tokens`; with shared prefixes also `total_prefix_tokens`
and `requests_per_prefix`; with sessions `duration_s` is the last session's arrival, `mean_qps`
null, and `num_sessions`, `mean_sessions_per_s`, `total_user_tokens` are added); with shared
prefixes `prefix` (`num_prefixes`, `share`, `zipf_a`, `prefix_len_tokens` per prefix,
`requests_per_prefix`); with sessions `session` (`num_sessions`, `arrivals`, min/mean/p50/p90/max
of `turns_per_session`, `user_tokens` and `think_time_s` (turns >= 1), `total_think_time_s`);
for traces also `trace_file`,
`trace_rows`, `clipped_requests`, `arrivals_from`, `rescaled_to_qps`; for a Mooncake trace
`prompt_blocks` (`block_tokens`, `trace_block_tokens` (512), `length_scale`,
`distinct_hash_ids`, `block_refs`, `reusable_prompt_tokens` and `reusable_prompt_share`: the
prompt tokens whose hash-id chain an earlier prompt had, what an unbounded prefix cache could
reuse); for imports (bench_import
stage) also `imported_from`, `imported_label`, `left_out_failed_requests`.

### `fidelity.json` (fidelity stage, schema {{fidelity_version}})

`schema_version`, `name` (the run id), `phase`, `partial` (true when the real phase stopped
part-way or a load was not sustained: the table is not the whole campaign), `notes` (why it is
partial), `command`, `date`, `device`, `driver`, `torch_threads`, `versions` (python, torch,
cuda, transformers, vidur, vllm), `requests_per_load` (at least), `load_duration_s` (both a range
`"low–high"` from an import whose loads differ), `warmup_s`,
`real_runs_per_load`, `load_fractions`, `wall_time_s`, `error_convention`, `capacity_rule`,
`capacity` (per backend: `probe_requests`, `probe_ok`, `probe_run`, `capacity_qps`,
`output_tokens_per_s`, `truth` (the probe's disturbance verdict and re-runs: `real_dir`,
`disturbed`, `reruns`, `attempts`; absent where the capacity was given), and `loads`:
`load_fraction`, `offered_qps`, `num_requests`, `realized_qps`,
`completion_ratio`, `sustained`, `window` (`warmup_s`, `requests_measured`, `requests_warmup`,
`completion_ratio`, `queue_trend`, `trend_clock`, `steady`), `compare_run`, `steps`), `rows` (the
`fidelity` table's rows), `clock_convention`, `headline_clock` (per backend: `engine` or `client`),
`largest_abs_error` (`abs_error_pct` and where, its `clock` among them, on each backend's
headline clock),
`largest_abs_error_by_backend`, `error_spread_by_backend` (`rows`, `median_abs_error_pct`,
`within_5pct`, `within_10pct`, `mean_signed_error_pct`), `by_clock` (per backend and clock:
`largest`, `spread`), and with repeated real runs `noise_spread_by_backend` and
`noise_spread_by_clock`. From a bench_import (`real_from` an import, `fidelity/imported.py`):
`imported` (`tool`, `file`, `sha256`, `import_run`, `capacity_source`, `scheduler_check`,
`noise_floor`, `disturbance`, and `runs`: per imported run `run`, `role`, `num_requests`,
`offered_qps`, `nominal_qps`, `real_dir`), and each capacity's `derived_from` and `source`.

### `fidelity-manifest.json` (fidelity stage, real phase, version {{manifest_version}})

`manifest_version`, `name`, `command`, the device fields of `fidelity.json`, `requests_per_load`,
`load_duration_s`, `warmup_s`, `load_fractions`, `wall_time_s`, `complete` (false until the last
load ran), `backends` (per backend: `config`, the pipeline config the loads were built from;
`profiling_root`; `capacity`; `loads` with `run_id`, `num_requests`, `warmup_s`, `workload_dir`,
`real_dir`, `repeat_dirs`, `scheduler`, `truth` and, for a load with its own bundle,
`profiling_root`; every path relative to the run directory).

### `tune.json` (tune stage, schema {{tune_version}})

`schema_version`, `objective` (`capacity` or `goodput`), `slo` (`percentile`, `goals_ms`),
`model`, `hardware`, `backend`, `space` (knob → its values), `configurations`, `refused`,
`simulations`, `shared_rate_qps` (where every configuration's latency is read: the configured
backend's simulated capacity, or `tune.qps`), `calibrated_with` (the knobs the one calibration
was made with), `best` (`config_id`, `knobs`, `score`, `flags`: the `vllm serve` flags) or null,
`configured_score`, `sim_seeds` (`count`, `seeds`, the noise seeds each configuration was
searched under, the median one answering; `scores`, per configuration one capacity per seed,
-1 where it met no rate, absent with one seed; `spread`, per configuration max / min − 1;
`median_spread`), `ranking` (config ids, best first), `pareto` (the ids on the frontier),
`note` (why no configuration meets the goals; empty otherwise), `num_requests`, `sim_window`
(null: every simulated rate judged the whole workload; with `capacity.sim_window`: `seconds`,
`min_requests`, `max_requests`, each rate judged the workload's first requests_at(rate)),
`simulated_wall_s`, `wall_time_s`, and `verify` (null, or `mode` (`top_k`, `grid`), `margin`,
`configs` (per configuration `config_id`, `configured`, `simulated_qps`, `measured_qps`,
`measured_bracket_qps`, `ratio`, `simulated_in_bracket`, `binding` (`simulated`, `real`), `note`,
`rates` (`qps`, `meets_slo`, `violated`), `disturbed_rates`, `stopped`, `wall_time_s`,
`latency_agreement`, `server_step_level` (the server's busy steps against the simulation's step
model: `ratio`, `steps`, `per_run`, and `judged`: `ratio`, `steps` and `rates` over the runs at
the measured bracket's rates, and `front_end`: whether the front end was scaled with the steps,
where the engine runs on the host's CPU; null without one), `simulated_at_server_level_qps` (the
simulated capacity again with every step, and with `front_end` every front-end cost, the judged
`ratio` times as long); with an adopted second
calibration also `first_calibration_qps` and `first_calibration_step_level`, the first's),
`simulated_best`,
`measured_best`, `measured_best_in_sim_top2`, `measured_order`, `spearman`, the verdict's
`judged_ranking` (`first calibration` after an adopted one, else `simulation`: the ranking whose
picks were measured), `judged_top2`, `tied_best` (measured within `server_spread` of the best),
`server_spread`, `winner` (null for a tie), `agrees` (the judged top 2 holds a tied best),
`calibration_speed` (the checked servers' levels together: `pooled_level`, weighted by busy
steps, `servers`, `range`, `one_sided`, and `note`, what to do when every server ran more than
8% off the calibration on the same side; null without a level), `wall_time_s`), and
`recalibration` (null, or the second calibration `tune.recalibrate` made: `reason`, `bundle`
(its profiling root), `first` and `second` (the checked servers' `calibration_speed` against
each), `adopted` (the servers' pooled level nearer 1 with the second: the ranking, `best`, the
table and the verify rows are then simulated with it), `levels` (per checked configuration, its
server against the second), `first_capacities_qps` and `capacities_qps` (every configuration
simulated with each), `wall_time_s`; when the second calibration failed, `error` and the first
kept), and `calibrations` (null with `tune.calibrations=1`; else `count`, `chosen` (which answers,
1 for the first bundle), `objective`, `bundles` (each one's profiling root), `levels` (each one's
geometric mean score over `judged_on` against the chosen one's; null when no configuration is
answered by all), `judged_on`, `scores` (per configuration one score per calibration, null where
it met no rate) and `spread` (per configuration max / min − 1 over them)).
"""


def declared_tables() -> tuple[TableSchema, ...]:
    """Every declared table: the shared ones (``io/schemas.py``) and each stage's contract."""
    from gpu_simulate_test.capacity.contract import CAPACITY_TABLE
    from gpu_simulate_test.compare import contract as compare_tables
    from gpu_simulate_test.deep_profile import contract as deep_profile_tables
    from gpu_simulate_test.fidelity.contract import FIDELITY_TABLE, FIDELITY_TABLE_WITH_REPORT
    from gpu_simulate_test.real_bench.contract import TELEMETRY
    from gpu_simulate_test.tune.contract import TUNE_TABLE
    from gpu_simulate_test.vidur_profile.contract import (
        ATTENTION_TABLE,
        ENGINE_STEPS_TABLE,
        MLP_TABLE,
        SERVING_STEPS_TABLE,
    )

    return (
        *ALL_TABLES,
        TELEMETRY,
        MLP_TABLE,
        ATTENTION_TABLE,
        ENGINE_STEPS_TABLE,
        SERVING_STEPS_TABLE,
        compare_tables.COMPARISON_PERCENTILES,
        compare_tables.COMPARISON_REQUESTS,
        compare_tables.COMPARISON_STEPS,
        compare_tables.SWEEP_TABLE,
        deep_profile_tables.OPERATORS,
        deep_profile_tables.STEP_TIMINGS,
        deep_profile_tables.STEP_COSTS,
        deep_profile_tables.LAYER_OPS,
        FIDELITY_TABLE,
        FIDELITY_TABLE_WITH_REPORT,
        CAPACITY_TABLE,
        TUNE_TABLE,
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
        if table.optional:
            notes.append("columns marked optional may be absent (older files, other writers)")
        parts.append((" " + "; ".join(notes) + ".") if notes else "")
        parts.append("\n\n| column | type | unit | nullable | min | meaning |\n")
        parts.append("| --- | --- | --- | --- | --- | --- |\n")
        for col in (*table.columns, *table.optional):
            minimum = "" if col.min_value is None else f"{col.min_value:g}"
            allowed = ", ".join(f"`{v}`" for v in col.allowed)
            meaning = f"{col.description}: one of {allowed}" if allowed else col.description
            meaning = f"optional: {meaning}" if col in table.optional else meaning
            parts.append(
                f"| `{col.name}` | {col.dtype} | {col.unit} | {'yes' if col.nullable else 'no'} "
                f"| {minimum} | {meaning} |\n"
            )
    from gpu_simulate_test.fidelity.contract import FIDELITY_SCHEMA_VERSION
    from gpu_simulate_test.fidelity.manifest import MANIFEST_VERSION
    from gpu_simulate_test.tune.contract import TUNE_SCHEMA_VERSION

    parts.append(
        JSON_ARTIFACTS.format(
            fidelity_version=FIDELITY_SCHEMA_VERSION,
            manifest_version=MANIFEST_VERSION,
            tune_version=TUNE_SCHEMA_VERSION,
        )
    )
    return "".join(parts)


if __name__ == "__main__":
    print(render(), end="")
