"""The real bench's engines, one frozen config each, with only that engine's knobs.

``backend=<name>`` (``configs/backend/<name>.yaml``) picks the engine; :data:`BACKENDS` maps the
name to its class. Composition (Hydra, a stored run's config) goes through :data:`BackendKnobs`,
every engine's knobs left unset (``???``); :func:`backend_config` then builds the named engine
from the knobs that were set (``server.*``: over that engine's own server defaults) and refuses,
by name, a knob of another engine (``backend.server.kind`` for an engine without a server).

Layout::

    BackendConfig                 every engine: timeout, GIL interval, warm-ups, host probe
    ├── HfGenerateBackendConfig   hf_generate: one request at a time, no knobs of its own
    ├── HttpBackendConfig         a server spoken to over HTTP: base_url, client, server, ...
    └── BatchingBackendConfig     the knobs Vidur's scheduler mirrors: token budget, batch cap,
        │                         KV-cache blocks and their size
        ├── HfCbBackendConfig     hf_cb: + block sharing, CUDA graphs
        ├── OpenAIBackendConfig   openai: + HttpBackendConfig's knobs
        └── VllmEngineBackendConfig   vllm_engine: + vLLM's engine knobs
            └── VllmBackendConfig     vllm: + HttpBackendConfig's knobs, the engine clock
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar

from omegaconf import MISSING

from gpu_simulate_test.config.renamed import RENAMED_KNOBS, check_renamed, current_names
from gpu_simulate_test.config.schema import (
    DEFAULT_BLOCK_SIZE,
    ConfigError,
    _check,
    _check_choice,
    check_block_size,
)

BACKEND_NAMES: tuple[str, ...] = ("hf_cb", "hf_generate", "openai", "vllm", "vllm_engine")
DEFAULT_BACKEND = "vllm"
"""The engine a config that names none gets (``RealBenchStageConfig()``, the pipeline's): a
real vLLM server, the pipeline's truth. The ``real_bench`` command and the engine calibration
(``vidur_profile engine.enable=true``) name ``hf_cb`` in their YAML instead: in-process, no
server to start, so a first run on a CPU takes seconds."""
DEFAULT_MAX_BATCH_TOKENS = 256
"""Token budget of one engine step (vLLM's ``--max-num-batched-tokens`` on CPU)."""
DEFAULT_MAX_REQUESTS_PER_BATCH = 32
"""Most requests in one engine step."""
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
    """How long a started server (``vllm_engine``: the engine) may take to answer ``/health``."""
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


SERVER_KNOBS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(ServerConfig))
"""Every ``backend.server.*`` knob."""


@dataclass(frozen=True)
class BackendConfig:
    """What every engine takes; one subclass per engine (:data:`BACKENDS`) adds its own knobs.
    A type for hints: build an engine's config with its class or :func:`backend_config`."""

    name: str = MISSING
    """hf_cb (transformers continuous batching), hf_generate (one at a time), openai (HTTP),
    vllm (a vLLM OpenAI server, started here or at ``base_url``) or vllm_engine (vLLM's engine
    in this process)."""
    request_timeout_s: float = 600.0
    """A request not finished this long after its arrival is recorded as ``timeout``."""
    gil_switch_interval_s: float = 0.0005
    """Python's thread switch interval during the replay (default 5 ms), lowered so the replay
    thread wakes on time while an in-process engine's thread runs Python code."""
    warmup_shapes: bool = True
    """Before the clock starts, one single-token request per step size the replay can meet
    (prompts of 1 to min(token budget, the longest prompt + batch cap) tokens, the budget and
    cap of :meth:`step_limits`, at most
    :data:`~gpu_simulate_test.core.engines.warmup.SHAPE_WARMUP_MAX` sizes): an engine's first step
    of a new size pays one-time costs a serving engine has long paid. On vLLM CPU the first run on
    a fresh server had TTFT p50 14-31% above the same workload run again (three of three), and a
    workload of one prompt length ran as fast cold as warm."""
    host_probe: bool = True
    """On CPU: read one LM head's bytes on the engine's core before the clock starts and after
    the last request (:mod:`~gpu_simulate_test.core.host.host_probe`, about 0.3 s each; recorded in
    ``run_meta.json`` ``host_probe``, not judged), and ``compare`` sets the reading against the
    calibration's."""

    server_knobs: ClassVar[tuple[str, ...]] = ()
    """The ``server.*`` knobs this engine reads (none: it has no ``server``)."""

    def __post_init__(self) -> None:
        _check_choice("backend.name", self.name, BACKEND_NAMES)
        _check(
            type(self) is BACKENDS[self.name],
            f"backend.name={self.name!r} takes {BACKENDS[self.name].__name__}, "
            f"not {type(self).__name__}",
        )
        _check(self.request_timeout_s > 0, "backend.request_timeout_s must be > 0")
        _check(
            0 < self.gil_switch_interval_s <= 0.1,
            f"backend.gil_switch_interval_s must be in (0, 0.1], got {self.gil_switch_interval_s}",
        )

    def step_limits(self) -> tuple[int, int]:
        """(token budget, request cap) of one engine step: the engine's own knobs where it has
        them (:class:`BatchingBackendConfig`); for hf_generate, which serves one request at a
        time, the batching engines' defaults (what the shape warm-up has always covered). The
        shape warm-up, the engine calibration and the capacity probe size themselves by these."""
        return DEFAULT_MAX_BATCH_TOKENS, DEFAULT_MAX_REQUESTS_PER_BATCH


@dataclass(frozen=True)
class HfGenerateBackendConfig(BackendConfig):
    """``hf_generate``: one request at a time through ``model.generate()`` (Vidur with batch
    cap 1); no knobs beyond every engine's."""

    name: str = "hf_generate"


@dataclass(frozen=True)
class HttpBackendConfig(BackendConfig):
    """An engine spoken to over HTTP (OpenAI ``/v1/completions``, streamed): openai, vllm."""

    base_url: str = "http://127.0.0.1:8000"
    """Server root (``/v1/completions`` is appended); ignored for a started server."""
    served_model_name: str | None = None
    """The ``model`` field of requests; None asks ``/v1/models`` (first entry)."""
    exact_length: str = "auto"
    """How exact output lengths are forced: ignore_eos (vLLM/SGLang), generation_config
    (transformers serve), none, or auto (generation_config for a started transformers serve,
    else ignore_eos)."""
    client: str = "threads"
    """How streams are read. threads: one thread per request in flight, each blocked on its
    socket; asyncio: one event loop on one thread for every request (as ``vllm bench serve``).
    On 2 CPU cores against vLLM the asyncio client was disturbed more often (8 of 12 runs
    against 4 of 12, ``benchmarks/results/truth_client.md``), so threads stays the default."""
    server: ServerConfig = field(default_factory=ServerConfig)
    """The server: one the user runs (``kind=external``) or one started here."""
    server_knobs: ClassVar[tuple[str, ...]] = SERVER_KNOBS

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_choice("backend.exact_length", self.exact_length, EXACT_LENGTH_MODES)
        _check_choice("backend.client", self.client, CLIENTS)
        _check(
            self.base_url.startswith(("http://", "https://")),
            f"backend.base_url={self.base_url!r} must start with http:// or https://",
        )


@dataclass(frozen=True)
class BatchingBackendConfig(BackendConfig):
    """An engine that batches requests into steps under a token budget over a paged KV cache:
    the knobs Vidur's scheduler mirrors one for one
    (:mod:`gpu_simulate_test.core.engines.knobs`)."""

    max_num_batched_tokens: int = DEFAULT_MAX_BATCH_TOKENS
    """Token budget of one step, long prefills chunked to fit (vLLM
    ``--max-num-batched-tokens``; transformers ``max_batch_tokens``; Vidur sarathi
    chunk_size)."""
    max_num_seqs: int = DEFAULT_MAX_REQUESTS_PER_BATCH
    """Most requests in one step (vLLM ``--max-num-seqs``; Vidur batch_size_cap)."""
    num_gpu_blocks_override: int = 512
    """KV-cache blocks (vLLM ``--num-gpu-blocks-override``; transformers ``num_blocks``; Vidur
    num_blocks); set explicitly, transformers' auto-sizing takes 60% of RAM."""
    block_size: int = DEFAULT_BLOCK_SIZE
    """Tokens per KV-cache block, transformers ``page_size`` (Vidur block_size)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("max_num_batched_tokens", "max_num_seqs", "num_gpu_blocks_override"):
            value = getattr(self, name)
            _check(value >= 1, f"backend.{name} must be >= 1, got {value}")
        check_block_size("backend.block_size", self.block_size)

    def step_limits(self) -> tuple[int, int]:
        return self.max_num_batched_tokens, self.max_num_seqs


@dataclass(frozen=True)
class OpenAIBackendConfig(HttpBackendConfig, BatchingBackendConfig):
    """``openai``: any OpenAI-compatible streaming server (vLLM, SGLang, transformers serve).
    Its batching knobs are those of a server it starts (``server.kind=transformers_serve``:
    ``--cb-max-batch-tokens``, ``--cb-num-blocks``, ``--cb-block-size``); of a server the user
    runs, what the shape warm-up and the capacity probe take it to have (:meth:`step_limits`)."""

    name: str = "openai"


@dataclass(frozen=True)
class HfCbBackendConfig(BatchingBackendConfig):
    """``hf_cb``: transformers continuous batching in this process, the engine Vidur's sarathi
    scheduler mirrors."""

    name: str = "hf_cb"
    allow_block_sharing: bool = False
    """Prefix block sharing; off so repeated prompts time like fresh ones (as in Vidur)."""
    use_cuda_graph: bool | None = None
    """CUDA graphs on GPU; None lets transformers decide."""


@dataclass(frozen=True)
class VllmEngineBackendConfig(BatchingBackendConfig):
    """``vllm_engine``: vLLM's engine driven in this process through ``AsyncLLM`` (the vllm
    server's engine core and scheduler, without its HTTP front end)."""

    name: str = "vllm_engine"
    num_gpu_blocks_override: int = 256
    block_size: int = 32
    """Tokens per KV-cache block (``--block-size``); vLLM's CPU attention needs a multiple of 32."""
    enable_prefix_caching: bool = False
    """Automatic prefix caching (``--enable-prefix-caching``); off by default, so that runs of
    one workload are independent. ``vllm_v1`` caches blocks as vLLM does when it is on (the
    derived scheduler takes it); a run checks the engine's prefix-cache hits either way."""
    enable_chunked_prefill: bool = True
    """Chunked prefill (Vidur's sarathi scheduler chunks the same way)."""
    enforce_eager: bool = True
    """No torch.compile (ready in seconds instead of minutes on CPU)."""
    kv_cache_space_gib: int = 0
    """On CPU: ``VLLM_CPU_KVCACHE_SPACE``, the memory the KV cache may take (GiB); 0: what
    ``num_gpu_blocks_override`` blocks of this model need, rounded up (at least 1)."""
    cpu_threads_bind: str = "auto"
    """On CPU: ``VLLM_CPU_OMP_THREADS_BIND``; auto leaves core 0 to the client (and the API
    server) and binds the engine to the others, or to core 0 on a one-core machine."""
    max_model_len: int = 0
    """``--max-model-len``; 0 takes the model's context (``max_position_embeddings``)."""
    gpu_memory_utilization: float = 0.9
    """On a GPU: ``--gpu-memory-utilization``, the share of the GPU's memory this engine may
    take (vLLM's default 0.9); lower it where several servers share one GPU. Not passed on CPU
    (the KV cache there is ``kv_cache_space_gib``)."""
    server: ServerConfig = field(default_factory=lambda: ServerConfig(startup_timeout_s=300.0))
    """Of it only ``startup_timeout_s`` applies (how long the engine may take to start): no
    server is started, and another server knob is refused by name (unless at its default)."""
    server_knobs: ClassVar[tuple[str, ...]] = ("startup_timeout_s",)

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.kv_cache_space_gib >= 0, "backend.kv_cache_space_gib must be >= 0 (0: auto)")
        _check(self.max_model_len >= 0, "backend.max_model_len must be >= 0")
        _check(
            0 < self.gpu_memory_utilization <= 1,
            f"backend.gpu_memory_utilization={self.gpu_memory_utilization} must be in (0, 1]",
        )


@dataclass(frozen=True)
class VllmBackendConfig(VllmEngineBackendConfig, HttpBackendConfig):
    """``vllm``: a vLLM OpenAI server, started here (over a saved snapshot of the model) or one
    the user runs at ``base_url`` (``server.kind=external``)."""

    name: str = "vllm"
    server: ServerConfig = field(
        default_factory=lambda: ServerConfig(kind="vllm", startup_timeout_s=300.0)
    )
    server_knobs: ClassVar[tuple[str, ...]] = SERVER_KNOBS
    engine_clock: bool = True
    """The engine's own clock per request (``engine_*`` columns), read from the server's
    OpenTelemetry spans (``--otlp-traces-endpoint`` to a receiver of this process). A server
    you run yourself needs ``server.spans_file`` for it."""
    data_parallel_size: int = 1
    """``--data-parallel-size``: engines behind the server's own balancer (a fleet of replicas
    of a dense model, vLLM's ``vllm_dp`` routing), with ``--api-server-count 1``; on CPU each
    engine bound to its own cores (``cpu_threads_bind=auto``). Each request's and each step's
    engine is recorded (an ``engine`` column)."""
    servers: int = 1
    """A fleet of this many servers, one engine each (``vllm serve --port <p+k>``, on CPU each
    bound to its own cores, on CUDA its own GPU), behind the client's own ``router``: each
    request's engine is the router's choice, recorded (an ``engine`` column) with each server's
    steps. Started here only (``server.kind=vllm``)."""
    router: str = "round_robin"
    """``servers`` > 1: the client's router between them: ``round_robin``,
    ``least_outstanding`` (fewest in flight, as the client counts them), ``random`` (seeded)
    or ``prefix_affinity`` (llm-d's scoring: the client's own index of the prompt blocks it sent
    each server, and each server's waiting requests and KV usage scraped from its ``/metrics``
    every ``router_poll_s``), as the simulator's routers of the same names (``fleet.router``)
    decide."""
    router_poll_s: float = 0.05
    """``router=prefix_affinity``: how often the client scrapes each server's load (llm-d's
    endpoint picker: 50 ms); the simulated fleet reads its engines as often (``fleet.poll_s``)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.data_parallel_size >= 1, "backend.data_parallel_size must be >= 1")
        _check(self.servers >= 1, "backend.servers must be >= 1")
        _check(
            self.router in CLIENT_ROUTERS,
            f"backend.router={self.router!r}: the client routes between servers by "
            f"{', '.join(CLIENT_ROUTERS)} (vllm_dp is one server's own balancer: "
            "backend.data_parallel_size)",
        )
        _check(self.router_poll_s > 0, "backend.router_poll_s must be > 0 (seconds)")
        _check(
            self.servers == 1 or self.data_parallel_size == 1,
            f"backend.servers={self.servers} and backend.data_parallel_size="
            f"{self.data_parallel_size} are two fleets: one server of N engines behind vLLM's "
            "balancer, or N servers of one engine behind the client's router; set one of them",
        )
        _check(
            self.servers == 1 or self.server.kind == "vllm",
            f"backend.servers={self.servers}: the fleet's servers are started here "
            "(backend.server.kind=vllm); behind your own router, point one run at each server",
        )


CLIENT_ROUTERS: tuple[str, ...] = ("round_robin", "least_outstanding", "random", "prefix_affinity")
"""The routers the client runs between ``backend.servers`` servers (the simulator's of the same
names, ``gpu_simulate_test.simulator.routers``)."""

BACKENDS: Mapping[str, type[BackendConfig]] = MappingProxyType(
    {
        "hf_cb": HfCbBackendConfig,
        "hf_generate": HfGenerateBackendConfig,
        "openai": OpenAIBackendConfig,
        "vllm": VllmBackendConfig,
        "vllm_engine": VllmEngineBackendConfig,
    }
)
"""``backend.name`` → the class of that engine's config."""

B = TypeVar("B", bound=BackendConfig)


def knob_names(name: str) -> tuple[str, ...]:
    """The knobs engine ``name`` takes (``name`` itself among them)."""
    return tuple(f.name for f in dataclasses.fields(BACKENDS[name]))


def _takes(name: str, knob: str) -> bool:
    """Whether engine ``name`` takes ``knob`` (``server.<sub>``: one of its server's knobs)."""
    top, _, sub = knob.partition(".")
    return top in knob_names(name) and (not sub or sub in BACKENDS[name].server_knobs)


def _owners(knob: str) -> str:
    owners = [name for name in BACKEND_NAMES if _takes(name, knob)]
    if len(owners) == 1:
        return f"an {owners[0]} knob" if owners[0][0] in "aeioh" else f"a {owners[0]} knob"
    return f"a knob of {', '.join(owners)}"


def default_server(name: str) -> ServerConfig | None:
    """Engine ``name``'s own server defaults (None: it has no ``server``)."""
    server = getattr(BACKENDS[name](), "server", None)
    return server if isinstance(server, ServerConfig) else None


def _same(value: Any, default: Any) -> bool:
    return bool(value == default or (isinstance(default, tuple) and tuple(value) == default))


def _foreign(name: str, knobs: Mapping[str, Any]) -> list[str]:
    """The knobs in ``knobs`` engine ``name`` does not take, a ``server`` mapping's by subknob.
    A server subknob the engine ignores (vllm_engine's, but ``startup_timeout_s``) passes at
    its default, as a run's record holds it."""
    every = {k for engine in BACKEND_NAMES for k in knob_names(engine)}
    foreign = []
    for knob, value in knobs.items():
        if knob == "server" and isinstance(value, Mapping) and value:
            default = default_server(name)
            foreign += [
                f"server.{sub}"
                for sub, given in value.items()
                if sub in SERVER_KNOBS
                and not _takes(name, f"server.{sub}")
                and not (default is not None and _same(given, getattr(default, sub)))
            ]
        elif knob not in knob_names(name) and knob in every:
            foreign.append(knob)
    return foreign


def check_knobs(name: str, knobs: Mapping[str, Any], prefix: str = "backend") -> None:
    """ConfigError naming every knob in ``knobs`` (a ``server`` mapping by subknob) that engine
    ``name`` does not take, and the engines that do (a knob of no engine at all is left to the
    schema's own check)."""
    _check_choice(f"{prefix}.name", name, BACKEND_NAMES)
    foreign = _foreign(name, knobs)
    if not foreign:
        return
    which = "; ".join(f"{prefix}.{k} is {_owners(k)}" for k in foreign)
    such = "such knob" if len(foreign) == 1 else "such knobs"
    raise ConfigError(
        f"{which}; {prefix}.name={name} has no {such} (to unset one a preset gives: "
        f"{prefix}.{foreign[0]}=???)"
    )


def backend_config(name: str = DEFAULT_BACKEND, **knobs: Any) -> BackendConfig:
    """Engine ``name``'s config with ``knobs`` (the rest its defaults); ``server`` as a mapping
    sets those of its knobs it holds over the engine's own server defaults. A knob of another
    engine is refused by name (:func:`check_knobs`), one by its old name with its new one."""
    check_renamed(knobs)
    check_knobs(name, knobs)
    server, default = knobs.get("server"), default_server(name)
    if isinstance(server, Mapping) and default is not None:
        knobs["server"] = dataclasses.replace(default, **server)
    return BACKENDS[name](name=name, **knobs)


def own_knobs(recorded: Mapping[str, Any]) -> dict[str, Any]:
    """A recorded backend config (``run_meta.json`` ``config.backend``, a bundle's calibration
    settings) with only its engine's knobs, each under its name today: records made before one
    class per engine held every engine's knobs, the others' at their defaults; records made
    before vLLM's names, the old ones (:func:`current_names`)."""
    recorded = current_names(recorded)
    name = recorded.get("name")
    if name not in BACKENDS:
        return recorded
    own = knob_names(str(name))
    return {k: v for k, v in recorded.items() if k in own}


def as_engine(backend: BackendConfig, cls: type[B]) -> B:
    """``backend`` as the config class ``cls`` an engine reads its knobs from; TypeError when
    it is another engine's (a programming error: each engine is picked by its name)."""
    if not isinstance(backend, cls):
        raise TypeError(
            f"backend {backend.name} has a {type(backend).__name__}, not a {cls.__name__}"
        )
    return backend


ServerKnobs: type = dataclasses.make_dataclass(
    "ServerKnobs",
    [(f.name, f.type, field(default=MISSING)) for f in dataclasses.fields(ServerConfig)],
    frozen=True,
    namespace={"__module__": __name__},
)
"""What a composed ``backend.server`` node accepts: every server knob, unset (``???``) until
given; the ones given are set over the engine's own server defaults (:func:`backend_config`)."""


def _knobs_schema() -> type:
    """:data:`BackendKnobs`: every engine's knobs, each unset (MISSING) until given."""
    fields: dict[str, tuple[Any, Any]] = {}
    for cls in BACKENDS.values():
        for f in dataclasses.fields(cls):
            fields.setdefault(f.name, (f.type, field(default=MISSING)))
    fields["server"] = (ServerKnobs, field(default_factory=ServerKnobs))
    for old in RENAMED_KNOBS:  # accepted here to be refused by name (check_renamed)
        fields[old] = (int, field(default=MISSING))
    return dataclasses.make_dataclass(
        "BackendKnobs",
        [(name, kind, default) for name, (kind, default) in fields.items()],
        bases=(BackendConfig,),
        frozen=True,
        namespace={"__module__": __name__},
    )


BackendKnobs: type = _knobs_schema()
"""What a composed ``backend`` node accepts before the engine is known: every engine's knobs,
typed, each unset (``???``) until a YAML file or an override sets it (``server``: each of its
knobs, :data:`ServerKnobs`). Only a schema for composition, never instantiated
(:func:`gpu_simulate_test.config.registry.to_typed` builds the named engine's class from the
knobs that were set)."""
