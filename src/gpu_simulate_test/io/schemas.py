"""Declared tables several stages share (the workload, request and token metrics, the engine
step log); each stage declares the rest in its ``contract.py``. ``specs/data_model.md``, generated
by :mod:`gpu_simulate_test.spec`, documents them all."""

from __future__ import annotations

from gpu_simulate_test.io.artifacts import Column, TableSchema

SESSION_COLUMNS: tuple[Column, ...] = (
    Column(
        "session_id",
        "int",
        "",
        "0-based session (conversation); a session's rows are contiguous, in turn order",
        min_value=0,
    ),
    Column("turn", "int", "", "0-based turn within the session", min_value=0),
    Column(
        "think_time_s",
        "float",
        "s",
        "wait after the previous turn's last token before this turn is sent (0 for turn 0)",
        min_value=0,
    ),
    Column(
        "user_tokens",
        "int",
        "tokens",
        "tokens of the turn's new user message; turn >= 1: num_prefill_tokens = the previous "
        "turn's num_prefill_tokens + num_decode_tokens + user_tokens",
        min_value=1,
    ),
)
"""A multi-turn workload's columns (``workload.session``, or a trace's own): all four or none."""

TRACE_LENGTHS = TableSchema(
    name="trace_lengths",
    version="1.3",
    description=(
        "Per-request token lengths of a workload; a workload with shared prefixes "
        "(`workload.prefix`) adds which prefix each prompt starts with, a multi-turn one "
        "(`workload.session`) each request's session and turn, a Mooncake trace's the hash ids "
        "of each prompt's blocks (optional columns, absent without them)."
    ),
    unique="request_id",
    columns=(
        Column(
            "request_id",
            "int",
            "",
            "0-based request index, in arrival order (sessions: by session, turns in order)",
            min_value=0,
        ),
        Column(
            "num_prefill_tokens",
            "int",
            "tokens",
            "prompt length (with a shared prefix: prefix + the request's own tokens)",
            min_value=1,
        ),
        Column(
            "num_decode_tokens", "int", "tokens", "output length (generated tokens)", min_value=1
        ),
    ),
    optional=(
        Column(
            "prefix_id",
            "int",
            "",
            "0-based id of the shared prefix the prompt starts with",
            min_value=0,
        ),
        Column("prefix_len", "int", "tokens", "tokens of that prefix", min_value=1),
        *SESSION_COLUMNS,
        Column(
            "hash_ids",
            "str",
            "",
            "a Mooncake trace's prompt as blocks: their hash ids, space-separated, in order "
            "(equal ids at the same positions, equal tokens)",
        ),
        Column(
            "block_tokens",
            "int",
            "tokens",
            "tokens of each of those blocks but the last, which holds the rest of the prompt",
            min_value=1,
        ),
    ),
)

TRACE_INTERVALS = TableSchema(
    name="trace_intervals",
    version="1.1",
    description=(
        "Per-request arrival times of a workload, relative to the first request; in a "
        "multi-turn workload only a session's turn 0 has one (turns >= 1 are empty: each is sent "
        "think_time_s after the previous turn's last token)."
    ),
    unique="request_id",
    sorted_by="arrival_time_s",
    columns=(
        Column(
            "request_id",
            "int",
            "",
            "0-based request index, in arrival order (sessions: by session, turns in order)",
            min_value=0,
        ),
        Column(
            "arrival_time_s",
            "float",
            "s",
            "arrival time from the start of the run (empty only for a session's turn >= 1)",
            nullable=True,
            min_value=0,
        ),
        Column(
            "inter_arrival_s",
            "float",
            "s",
            "gap to the previous arrival (0 for the first; empty where arrival_time_s is)",
            nullable=True,
            min_value=0,
        ),
    ),
)

TRACE_IMPORT = TableSchema(
    name="trace_import",
    version="1.1",
    description=(
        "A real trace to import (Vidur's processed traces): arrived_at is optional; without it, "
        "arrivals are generated. A multi-turn trace adds the four session columns (all or none); "
        "its arrived_at is then empty for every turn >= 1."
    ),
    columns=(
        Column("num_prefill_tokens", "int", "tokens", "prompt length", min_value=1),
        Column("num_decode_tokens", "int", "tokens", "output length", min_value=1),
    ),
    optional=SESSION_COLUMNS,
)

TRACE_IMPORT_ARRIVED_AT = Column("arrived_at", "float", "s", "arrival time", min_value=0)

PROMPT_RECORD_KEYS: tuple[str, ...] = (
    "request_id",
    "num_prefill_tokens",
    "num_decode_tokens",
)
"""Keys every ``prompts.jsonl`` line carries, plus ``prompt_token_ids`` or ``prompt_text`` (and,
with shared prefixes, ``prefix_id`` and ``prefix_len``; with sessions, ``session_id``, ``turn``,
``think_time_s`` and ``user_tokens``, and a turn >= 1's prompt is its new user message only)."""

REQUEST_STATUSES: tuple[str, ...] = ("ok", "error", "timeout", "cancelled")
"""Every ``status`` a request_metrics row may have: the real bench's terminal statuses
(``real_bench.records.TERMINAL_STATUSES``: ok; error, the engine failed it or produced the wrong
number of tokens; timeout; cancelled, in flight when the run stopped). Vidur writes only ok."""

ENGINE_CLOCK_COLUMNS: tuple[Column, ...] = (
    Column(
        "engine_arrival_time_s",
        "float",
        "s",
        "when the engine queued the request (vLLM queued_ts, transformers created_time), run clock",
        nullable=True,
    ),
    Column(
        "engine_scheduled_time_s",
        "float",
        "s",
        "when the engine first scheduled it (end of queueing), run clock",
        nullable=True,
    ),
    Column(
        "engine_first_token_time_s",
        "float",
        "s",
        "the engine's stamp of the first output token, run clock",
        nullable=True,
    ),
    Column(
        "engine_last_token_time_s",
        "float",
        "s",
        "the engine's stamp of the last output token, run clock",
        nullable=True,
    ),
    Column(
        "engine_ttft_s",
        "float",
        "s",
        "engine arrival to the engine's first token (the front end left out)",
        nullable=True,
        min_value=0,
    ),
    Column(
        "engine_tpot_s",
        "float",
        "s",
        "(engine last token - engine first token) / (output tokens - 1)",
        nullable=True,
        min_value=0,
    ),
    Column(
        "engine_e2e_s",
        "float",
        "s",
        "engine arrival to the engine's last token",
        nullable=True,
        min_value=0,
    ),
    Column(
        "engine_scheduling_delay_s",
        "float",
        "s",
        "engine arrival to first scheduled (time queued in the engine)",
        nullable=True,
        min_value=0,
    ),
)
"""The engine's own clock for each request, where the backend has one (``hf_cb``,
``vllm_engine``; empty for the others): what Vidur models, without the front end."""

FLEET_COLUMN = Column(
    "engine",
    "int",
    "",
    "a fleet's engine (0 to replicas - 1; vLLM's data-parallel rank) the request or step ran "
    "on; absent for one engine, empty for a real request that reached none",
    nullable=True,
    min_value=0,
)
"""Where a fleet ran each request or step (an optional column of the per-request and step
tables)."""

PREFIX_CACHE_COLUMNS: tuple[Column, ...] = (
    Column(
        "cached_tokens",
        "int",
        "tokens",
        "prompt tokens the engine found in its prefix cache, as the server reported them "
        "(usage.prompt_tokens_details.cached_tokens); empty where it reported none",
        nullable=True,
        min_value=0,
    ),
    Column(
        "engine_cached_tokens",
        "int",
        "tokens",
        "the same as the engine's scheduler recorded it (the hit at the request's first "
        "admission); empty without the scheduler's record",
        nullable=True,
        min_value=0,
    ),
)
"""Prefix caching per request (schema 1.2), where the engine reports it (the ``vllm`` backend;
``cached_tokens`` with ``--enable-prompt-tokens-details``, which it passes with caching on)."""

REQUEST_METRICS = TableSchema(
    name="request_metrics",
    version="1.3",
    description=(
        "Per-request latency of a real or simulated run (vllm bench serve conventions); a real "
        "run adds the engine's own clock and its prefix-cache hits (optional columns, empty "
        "where the backend has none). A real run's extra scheduled_arrival_time_s is when each "
        "send was due: the workload's arrival, or, for a multi-turn session's turn >= 1 (a "
        "closed loop), the time the loop intended: turn k-1's last output token at the client "
        "+ think_time_s; arrival_error_s = arrival_time_s - scheduled_arrival_time_s. A turn "
        "not sent (its session's previous turn failed) has no row."
    ),
    unique="request_id",
    columns=(
        Column("request_id", "int", "", "request index from the workload", min_value=0),
        Column(
            "arrival_time_s",
            "float",
            "s",
            "actual arrival time from run start (a real run: when the client sent it; a "
            "multi-turn session's later turn: its closed loop's realized send)",
            min_value=0,
        ),
        Column("num_prefill_tokens", "int", "tokens", "prompt length", min_value=0),
        Column("num_decode_tokens", "int", "tokens", "output tokens produced", min_value=0),
        Column(
            "ttft_s",
            "float",
            "s",
            "arrival to first output token (queueing included)",
            nullable=True,
            min_value=0,
        ),
        Column(
            "tpot_s", "float", "s", "(e2e - ttft) / (output tokens - 1)", nullable=True, min_value=0
        ),
        Column("e2e_s", "float", "s", "arrival to last output token", nullable=True, min_value=0),
        Column("status", "str", "", "how the request ended", allowed=REQUEST_STATUSES),
    ),
    optional=ENGINE_CLOCK_COLUMNS + PREFIX_CACHE_COLUMNS + (FLEET_COLUMN,),
)

TOKEN_METRICS = TableSchema(
    name="token_metrics",
    version="1.0",
    description="Per-token times of a real run.",
    columns=(
        Column("request_id", "int", "", "request index", min_value=0),
        Column("token_index", "int", "", "0-based output token index", min_value=0),
        Column("time_s", "float", "s", "time the token was observed, from run start", min_value=0),
        Column(
            "itl_s",
            "float",
            "s",
            "gap to the previous token of the request (empty for the first)",
            nullable=True,
            min_value=0,
        ),
    ),
)

ENGINE_STEP_LOG = TableSchema(
    name="engine_step_log",
    version="1.1",
    description=(
        "An engine's steps: a real engine's own per-step log (vLLM "
        "--enable-logging-iteration-details), one row per step taken during the replay (warm-up "
        "steps left out), or Vidur's simulated batches (no times)."
    ),
    columns=(
        Column("step_index", "int", "", "the engine's step counter (Iteration(N))", min_value=0),
        Column(
            "time_s",
            "float",
            "s",
            "when the step's log line was read, from run start (step end plus log latency); "
            "empty for simulated batches",
            nullable=True,
        ),
        Column("num_prefill_requests", "int", "", "requests with prompt tokens", min_value=0),
        Column("num_prefill_tokens", "int", "tokens", "prompt tokens computed", min_value=0),
        Column("num_decode_requests", "int", "", "requests generating a token", min_value=0),
        Column("num_decode_tokens", "int", "tokens", "tokens generated", min_value=0),
        Column(
            "elapsed_ms", "float", "ms", "the step's time as the engine measured it", min_value=0
        ),
        Column(
            "kv_cache_usage_pct",
            "float",
            "%",
            "KV cache in use after the step",
            nullable=True,
            min_value=0,
        ),
    ),
    optional=(FLEET_COLUMN,),
)

ENGINE_SCHEDULE = TableSchema(
    name="engine_schedule",
    version="1.1",
    description=(
        "Every step a vLLM engine took, as its own scheduler recorded it on the engine core's "
        "clock (the recording scheduler, core/engines/vllm_recording_scheduler.py): when "
        "scheduling began and when the outputs were made, which requests ran with how many "
        "tokens, and who was preempted. One row per step from the run's first request on."
    ),
    sorted_by="start_time_s",
    columns=(
        Column("step_index", "int", "", "the step's position in the run, from 0", min_value=0),
        Column("start_time_s", "float", "s", "when scheduling began, run clock"),
        Column("end_time_s", "float", "s", "when its outputs were made, run clock"),
        Column(
            "num_prefill_requests",
            "int",
            "",
            "requests vLLM counts as context (no output token yet)",
            min_value=0,
        ),
        Column("num_prefill_tokens", "int", "tokens", "their scheduled tokens", min_value=0),
        Column(
            "num_decode_requests",
            "int",
            "",
            "the other requests (generation; a request resumed after preemption recomputes here)",
            min_value=0,
        ),
        Column("num_decode_tokens", "int", "tokens", "their scheduled tokens", min_value=0),
        Column("num_preempted", "int", "", "requests preempted while scheduling it", min_value=0),
        Column("num_waiting", "int", "", "requests waiting after scheduling it", min_value=0),
        Column("num_running", "int", "", "requests running after scheduling it", min_value=0),
        Column(
            "requests",
            "str",
            "",
            "the scheduled requests as request_id:tokens, space-separated (x: another run's)",
        ),
    ),
    optional=(FLEET_COLUMN,),
)

FRONT_END_STAMPS = TableSchema(
    name="front_end_stamps",
    version="1.0",
    description=(
        "A vLLM server's API server, request by request, from its OpenTelemetry span: when it "
        "received the request and when it handled the first output the engine sent back, on "
        "the run clock. With the client's and the engine's stamps they split each first token's "
        "time into its hops (compare's *Where the first token's time goes*)."
    ),
    unique="request_id",
    columns=(
        Column("request_id", "int", "", "the request", min_value=0),
        Column("front_arrival_time_s", "float", "s", "the API server received it, run clock"),
        Column(
            "front_first_token_time_s",
            "float",
            "s",
            "the API server handled its first output (span arrival + its TTFT), run clock",
        ),
    ),
)


ROUTER_READS = TableSchema(
    name="router_reads",
    version="1.0",
    description=(
        "What the client's router read of each server when it routed a request "
        "(``backend.router=prefix_affinity``: the servers' scraped ``/metrics``), and where it "
        "sent it. An oracle replay's simulated router reads these instead of its engines' "
        "state, so its decisions are held equal to the client's before time is judged."
    ),
    unique="request_id",
    columns=(
        Column("request_id", "int", "", "the request", min_value=0),
        Column("routed_time_s", "float", "s", "when the router decided, run clock"),
        Column("engine", "int", "", "the server it was sent to", min_value=0),
        Column(
            "num_waiting",
            "str",
            "",
            "each server's vllm:num_requests_waiting as last scraped, space-separated by server",
        ),
        Column(
            "kv_cache_usage",
            "str",
            "",
            "each server's vllm:kv_cache_usage_perc (0..1) as last scraped, space-separated",
        ),
    ),
)


ALL_TABLES: tuple[TableSchema, ...] = (
    TRACE_LENGTHS,
    TRACE_INTERVALS,
    TRACE_IMPORT,
    REQUEST_METRICS,
    TOKEN_METRICS,
    ENGINE_STEP_LOG,
    ENGINE_SCHEDULE,
    FRONT_END_STAMPS,
    ROUTER_READS,
)
