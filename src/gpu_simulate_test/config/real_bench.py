"""Typed config of the ``real_bench`` stage: replay a workload against a real serving engine."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING

from gpu_simulate_test.config.schema import (
    DEFAULT_BLOCK_SIZE,
    DTYPES,
    ConfigError,
    GoodputConfig,
    HardwareConfig,
    ModelConfig,
    OutputConfig,
    _check,
    _check_choice,
    check_block_size,
)

BACKEND_NAMES: tuple[str, ...] = ("hf_cb", "hf_generate", "openai", "vllm", "vllm_engine")
ATTN_IMPLEMENTATIONS: tuple[str, ...] = (
    "sdpa",
    "eager",
    "paged|eager",
    "flash_attention_2",
    "flash_attention_3",
)
SERVER_KINDS: tuple[str, ...] = ("external", "transformers_serve", "vllm")
EXACT_LENGTH_MODES: tuple[str, ...] = ("auto", "ignore_eos", "generation_config", "none")
CLIENTS: tuple[str, ...] = ("asyncio", "threads")


@dataclass(frozen=True)
class ServerConfig:
    """A server the ``openai``/``vllm`` backends start and stop themselves, or one the user runs."""

    kind: str = "external"
    """external (the user runs it at ``base_url``), transformers_serve or vllm (started on
    127.0.0.1 in its own process group and stopped by pid)."""
    port: int = 0
    """Loopback port for a started server; 0 picks a free one."""
    startup_timeout_s: float = 180.0
    """How long a started server may take to answer ``/health``."""
    extra_args: tuple[str, ...] = ()
    """Extra command-line arguments for the started server."""
    log_file: str | None = None
    """vllm with kind=external: the server's log file (started with
    ``--enable-logging-iteration-details``); its per-step lines are read from there."""
    nice: int = 0
    """A started server's nice value (0..19), set on every thread of its processes once it is
    up: above 0 the client's threads, on the same core as vLLM's API server and engine core,
    win the core sooner when they wake (the client uses a few hundredths of a core)."""
    spans_file: str | None = None
    """vllm with kind=external: where the server's per-request OpenTelemetry spans are kept (a
    server started by this project's ``served()``: ``otlp_spans.jsonl`` beside its log); the
    engine's own clock per request is read from there."""
    steps_file: str | None = None
    """vllm with kind=external: where the server's scheduler records its steps (a server started
    by this project's ``served()``: ``engine_steps.jsonl`` beside its log, written by the
    recording scheduler); each run's ``engine_schedule.csv`` and exact engine stamps come from
    there."""

    def __post_init__(self) -> None:
        _check_choice("backend.server.kind", self.kind, SERVER_KINDS)
        _check(0 <= self.port <= 65535, f"backend.server.port must be in 0..65535, got {self.port}")
        _check(self.startup_timeout_s > 0, "backend.server.startup_timeout_s must be > 0")
        _check(0 <= self.nice <= 19, f"backend.server.nice must be in 0..19, got {self.nice}")


@dataclass(frozen=True)
class BackendConfig:
    """Which engine serves the requests, and its knobs (hf_cb mirrors Vidur's sarathi scheduler)."""

    name: str = "hf_cb"
    """hf_cb (transformers continuous batching), hf_generate (one at a time), openai (HTTP) or
    vllm (a vLLM OpenAI server, started here or at ``base_url``)."""
    max_batch_tokens: int = 256
    """hf_cb, vllm: token budget of one step, long prefills chunked to fit (vLLM
    ``--max-num-batched-tokens``; Vidur sarathi chunk_size)."""
    max_requests_per_batch: int = 32
    """hf_cb, vllm: most requests in one step (vLLM ``--max-num-seqs``; Vidur batch_size_cap)."""
    num_blocks: int = 512
    """hf_cb, vllm: KV-cache blocks (vLLM ``--num-gpu-blocks-override``; Vidur num_blocks); set
    explicitly, transformers' auto-sizing takes 60% of RAM."""
    block_size: int = DEFAULT_BLOCK_SIZE
    """hf_cb, vllm: tokens per KV-cache block, transformers ``page_size`` (Vidur block_size)."""
    enable_prefix_caching: bool = False
    """vllm: automatic prefix caching; off, as Vidur does not model it (a run checks the
    server's prefix-cache hits either way)."""
    enable_chunked_prefill: bool = True
    """vllm: chunked prefill (Vidur's sarathi scheduler chunks the same way)."""
    enforce_eager: bool = True
    """vllm: no torch.compile (ready in seconds instead of minutes on CPU)."""
    kv_cache_space_gib: int = 0
    """vllm on CPU: ``VLLM_CPU_KVCACHE_SPACE``, the memory the KV cache may take (GiB); 0: what
    ``num_blocks`` blocks of this model need, rounded up (at least 1)."""
    cpu_threads_bind: str = "auto"
    """vllm on CPU: ``VLLM_CPU_OMP_THREADS_BIND``; auto leaves core 0 to the client (and the
    API server) and binds the engine to the others, or to core 0 on a one-core machine."""
    max_model_len: int = 0
    """vllm: ``--max-model-len``; 0 takes the model's context (``max_position_embeddings``)."""
    allow_block_sharing: bool = False
    """hf_cb: prefix block sharing; off so repeated prompts time like fresh ones (as in Vidur)."""
    use_cuda_graph: bool | None = None
    """hf_cb: CUDA graphs on GPU; None lets transformers decide."""
    base_url: str = "http://127.0.0.1:8000"
    """openai: server root (``/v1/completions`` is appended); ignored for a started server."""
    served_model_name: str | None = None
    """openai: the ``model`` field of requests; None asks ``/v1/models`` (first entry)."""
    exact_length: str = "auto"
    """openai: how exact output lengths are forced: ignore_eos (vLLM/SGLang), generation_config
    (transformers serve), none, or auto (generation_config for a started transformers serve,
    else ignore_eos)."""
    client: str = "threads"
    """openai/vllm: how streams are read. threads: one thread per request in flight, each
    blocked on its socket; asyncio: one event loop on one thread for every request (as ``vllm
    bench serve``). On 2 CPU cores against vLLM the asyncio client was disturbed more often (8
    of 12 runs against 4 of 12, ``benchmarks/results/truth_client.md``), so threads stays the
    default."""
    engine_clock: bool = True
    """vllm: the engine's own clock per request (``engine_*`` columns), read from the server's
    OpenTelemetry spans (``--otlp-traces-endpoint`` to a receiver of this process). A server
    you run yourself needs ``server.spans_file`` for it."""
    server: ServerConfig = field(default_factory=ServerConfig)
    request_timeout_s: float = 600.0
    """A request not finished this long after its arrival is recorded as ``timeout``."""
    gil_switch_interval_s: float = 0.0005
    """In-process backends: Python's thread switch interval during the replay (default 5 ms),
    lowered so the replay thread wakes on time while the engine thread runs Python code."""
    warmup_shapes: bool = True
    """Before the clock starts, one single-token request per step size the replay can meet
    (prompts of 1 to min(``max_batch_tokens``, the longest prompt + ``max_requests_per_batch``)
    tokens, at most :data:`~gpu_simulate_test.core.warmup.SHAPE_WARMUP_MAX` sizes): an
    engine's first step of a new size pays one-time costs a serving engine has long paid. On
    vLLM CPU the first run on a fresh server had TTFT p50 14-31% above the same workload run
    again (three of three), and a workload of one prompt length ran as fast cold as warm."""
    host_probe: bool = True
    """On CPU: read one LM head's bytes on the engine's core before the clock starts and after
    the last request (:mod:`~gpu_simulate_test.core.host_probe`, about 0.3 s each; recorded in
    ``run_meta.json`` ``host_probe``, not judged), and ``compare`` sets the reading against the
    calibration's."""

    def __post_init__(self) -> None:
        _check_choice("backend.name", self.name, BACKEND_NAMES)
        _check_choice("backend.exact_length", self.exact_length, EXACT_LENGTH_MODES)
        _check_choice("backend.client", self.client, CLIENTS)
        for name in ("max_batch_tokens", "max_requests_per_batch", "num_blocks"):
            value = getattr(self, name)
            _check(value >= 1, f"backend.{name} must be >= 1, got {value}")
        check_block_size("backend.block_size", self.block_size)
        _check(self.request_timeout_s > 0, "backend.request_timeout_s must be > 0")
        _check(self.kv_cache_space_gib >= 0, "backend.kv_cache_space_gib must be >= 0 (0: auto)")
        _check(self.max_model_len >= 0, "backend.max_model_len must be >= 0")
        _check(
            0 < self.gil_switch_interval_s <= 0.1,
            f"backend.gil_switch_interval_s must be in (0, 0.1], got {self.gil_switch_interval_s}",
        )
        _check(
            self.base_url.startswith(("http://", "https://")),
            f"backend.base_url={self.base_url!r} must start with http:// or https://",
        )


@dataclass(frozen=True)
class RealBenchStageConfig:
    """``real_bench``: replay a workload run at its arrival times and time every token."""

    model: ModelConfig = MISSING
    hardware: HardwareConfig = MISSING
    backend: BackendConfig = field(default_factory=BackendConfig)
    workload_dir: str = MISSING
    """The workload run to replay (``tmp/workload/<run_id>``)."""
    dtype: str = "auto"
    """float32, bfloat16, float16, or auto (bfloat16 on CUDA, float32 on CPU)."""
    attn_implementation: str = "sdpa"
    """Attention kernel of in-process backends."""
    num_warmup_requests: int = 2
    """Requests sent (and discarded) before the clock starts: the workload's first ones."""
    max_requests: int = 0
    """Replay only the first N requests of the workload; 0 replays all."""
    telemetry_interval_s: float = 0.1
    """GPU telemetry (NVML) sampling period; nothing is sampled without a GPU."""
    nvtx: bool = True
    """NVTX ranges around prefill and decode steps when the ``nvtx`` package and CUDA are there."""
    goodput: GoodputConfig = field(default_factory=GoodputConfig)
    """Goals per request (ms) for ``request_goodput``, as ``vllm bench serve --goodput``:
    ``goodput.ttft=500 goodput.tpot=50 goodput.e2el=1000`` (any subset; none: not reported)."""
    output: OutputConfig = field(default_factory=OutputConfig)
    progress: bool = True
    """Show the live progress bar and the summary table."""

    def __post_init__(self) -> None:
        if not self.workload_dir:
            raise ConfigError("workload_dir is required: pass workload_dir=tmp/workload/<run_id>")
        _check(
            self.dtype == "auto" or self.dtype in DTYPES,
            f"dtype={self.dtype!r} is not one of auto, {', '.join(DTYPES)}",
        )
        _check_choice("attn_implementation", self.attn_implementation, ATTN_IMPLEMENTATIONS)
        _check(self.num_warmup_requests >= 0, "num_warmup_requests must be >= 0")
        _check(self.max_requests >= 0, "max_requests must be >= 0")
        _check(self.telemetry_interval_s > 0, "telemetry_interval_s must be > 0")
