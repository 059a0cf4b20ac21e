"""The tune's configurations: every combination of the space's knobs over the configured
backend (the engine's knobs, and the fleet's: replicas behind a router), each checked against
vLLM's own rules, and the one backend the calibration is made with so that it covers them
all."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from gpu_simulate_test.config.backends import VllmEngineBackendConfig
from gpu_simulate_test.config.fleet import FleetConfig
from gpu_simulate_test.config.schema import ConfigError, ModelConfig
from gpu_simulate_test.config.tune import FLEET_KNOBS, TUNE_KNOBS, TuneOptions

SHORT: Mapping[str, str] = MappingProxyType(
    {
        "max_num_seqs": "s",
        "max_num_batched_tokens": "t",
        "num_gpu_blocks_override": "b",
    }
)
"""A configuration's id names each varied number knob by a letter and its value (``s8-t128``);
a varied switch is ``chunk``/``nochunk``, ``pc``/``nopc``."""
SWITCHES: Mapping[str, tuple[str, str]] = MappingProxyType(
    {
        "enable_chunked_prefill": ("chunk", "nochunk"),
        "enable_prefix_caching": ("pc", "nopc"),
    }
)
TUNE_KNOBS_ORDER: tuple[str, ...] = tuple(TUNE_KNOBS)
"""The knobs in the order the table lists them."""
ROUTER_SHORT: Mapping[str, str] = MappingProxyType(
    {
        "vllm_dp": "dp",
        "round_robin": "rr",
        "least_outstanding": "lo",
        "prefix_affinity": "pa",
        "random": "rand",
    }
)
"""A fleet's id: ``r<replicas>`` where the space has more than one replica count, and its
router's short name where it has more than one router (``r4-rr-s8-t128``); one replica has no
router in its id."""
DEFAULT_ROUTER = "vllm_dp"
CONFIGURED_ID = "configured"
"""The id of the configured backend when the space does not contain it."""


@dataclass(frozen=True)
class Candidate:
    """One configuration of the engine."""

    config_id: str
    knobs: Mapping[str, Any]
    """Every knob of :data:`TUNE_KNOBS`, by ``vllm serve``'s name."""
    backend: VllmEngineBackendConfig
    configured: bool
    """The backend as configured (``backend.*``): the baseline every report sets the rest
    beside."""
    invalid: str = ""
    """Why vLLM would refuse it (empty: it runs)."""
    replicas: int = 1
    """Engines, one GPU each (tensor parallelism 1)."""
    router: str = DEFAULT_ROUTER
    """The router in front of them (one replica: the configured router, unused)."""

    @property
    def gpus(self) -> int:
        return self.replicas

    @property
    def routed_by(self) -> str | None:
        """The router a deployment of it needs (None: one engine needs none)."""
        return self.router if self.replicas > 1 else None

    @property
    def checkable(self) -> bool:
        """Whether the real bench serves it: one engine, a fleet its backend runs as
        ``--data-parallel-size N`` (vLLM's server behind its own balancer), or N servers it
        starts behind the client's router (:func:`fleet_backend`); the in-process engine's
        fleets, and servers you run yourself, are not."""
        engines = int(getattr(self.backend, "data_parallel_size", 1))
        return engines * int(getattr(self.backend, "servers", 1)) == self.replicas

    @property
    def fleet(self) -> FleetConfig:
        """The simulator's ``fleet.*`` for this configuration."""
        return FleetConfig(self.replicas, self.router)

    def apart(self, other: Candidate) -> int:
        """Knobs (the engine's and the fleet's) that differ from ``other``'s."""
        engine = sum(self.knobs[n] != other.knobs[n] for n in self.knobs)
        return engine + (self.replicas != other.replicas) + (self.router != other.router)


def knobs_of(backend: VllmEngineBackendConfig) -> dict[str, Any]:
    """The tune's knobs as ``backend`` sets them."""
    return {name: getattr(backend, field) for name, field in TUNE_KNOBS.items()}


def with_knobs(backend: VllmEngineBackendConfig, knobs: Mapping[str, Any]) -> Any:
    """``backend`` with the tune's ``knobs`` (by ``vllm serve``'s names) set."""
    return dataclasses.replace(backend, **{TUNE_KNOBS[name]: v for name, v in knobs.items()})


def base_fleet(backend: Any) -> tuple[int, str]:
    """The configured fleet: ``backend.servers`` servers behind the client's ``backend.router``,
    or ``backend.data_parallel_size`` engines behind vLLM's balancer (one engine for a backend
    with neither)."""
    servers = int(getattr(backend, "servers", 1))
    if servers > 1:
        return servers, str(backend.router)
    return int(getattr(backend, "data_parallel_size", 1)), DEFAULT_ROUTER


def fleet_backend(backend: Any, replicas: int, router: str) -> Any:
    """The backend a configuration's real bench runs: one ``--data-parallel-size N`` server
    where vLLM's own balancer routes (``vllm_dp``), N servers of one engine behind the client's
    ``router`` otherwise (``backend.servers``, where the bench starts its servers itself; one
    engine where it does not: such a fleet is simulated only)."""
    if not hasattr(backend, "data_parallel_size"):
        return backend
    if router == DEFAULT_ROUTER or replicas == 1:
        return dataclasses.replace(backend, data_parallel_size=replicas, servers=1)
    started_here = backend.server.kind == "vllm"
    return dataclasses.replace(
        backend,
        data_parallel_size=1,
        servers=replicas if started_here else 1,
        router=router if started_here else backend.router,
    )


def config_id(
    knobs: Mapping[str, Any],
    varied: tuple[str, ...],
    fleet: tuple[int, str] = (1, DEFAULT_ROUTER),
    fleet_varied: tuple[str, ...] = (),
) -> str:
    replicas, router = fleet
    parts = [f"r{replicas}"] if "replicas" in fleet_varied else []
    if "router" in fleet_varied and replicas > 1:
        parts.append(ROUTER_SHORT[router])
    for name in varied:
        if name in SWITCHES:
            parts.append(SWITCHES[name][0] if knobs[name] else SWITCHES[name][1])
        else:
            parts.append(f"{SHORT[name]}{knobs[name]}")
    return "-".join(parts) or f"r{replicas}"


def max_model_len(backend: VllmEngineBackendConfig, model: ModelConfig) -> int:
    """vLLM's max_model_len for ``backend`` as the served engine is given it
    (``backend.max_model_len``, or the longest sequence the model and the KV cache hold)."""
    if backend.max_model_len:
        return int(backend.max_model_len)
    cache = (
        (backend.num_gpu_blocks_override - 1) * backend.block_size
        if backend.num_gpu_blocks_override > 1
        else 0
    )
    return min(model.max_position_embeddings, cache) if cache else model.max_position_embeddings


def refusal(backend: VllmEngineBackendConfig, model: ModelConfig, longest: int) -> str:
    """Why vLLM 0.32 would refuse this configuration, or this workload on it (empty: neither);
    the rules of its ``SchedulerConfig.verify_max_model_len``."""
    tokens, seqs = backend.max_num_batched_tokens, backend.max_num_seqs
    limit = max_model_len(backend, model)
    if tokens < seqs:
        return f"max_num_batched_tokens ({tokens}) must be >= max_num_seqs ({seqs})"
    if not backend.enable_chunked_prefill and tokens < limit:
        return (
            f"without chunked prefill max_num_batched_tokens ({tokens}) must be >= "
            f"max_model_len ({limit}; set backend.max_model_len to lower it)"
        )
    if longest > limit:
        return f"the workload's longest request ({longest} tokens) is over max_model_len ({limit})"
    return ""


def candidates(
    opts: TuneOptions, backend: Any, model: ModelConfig, longest: int
) -> list[Candidate]:
    """Every combination of the space over ``backend`` (the fleet's knobs outermost, then the
    space's order: the last knob varies fastest; one replica once, whatever the routers), and
    the configured backend last when the space does not contain it."""
    everything = opts.knobs()
    space = {name: v for name, v in everything.items() if name in TUNE_KNOBS}
    varied = tuple(name for name in TUNE_KNOBS if name in space)
    fleet_varied = tuple(name for name in FLEET_KNOBS if len(everything.get(name, ())) > 1)
    base, (replicas0, router0) = knobs_of(backend), base_fleet(backend)
    routers = everything.get("router", (router0,))
    fleets = [
        (n, router if n > 1 else routers[0])
        for n in everything.get("replicas", (replicas0,))
        for router in (routers if n > 1 else routers[:1])
    ]
    found: list[Candidate] = []
    for (n, router), values in itertools.product(fleets, itertools.product(*space.values())):
        knobs = {**base, **dict(zip(space, values, strict=True))}
        engine = fleet_backend(with_knobs(backend, knobs), n, router)
        configured = knobs == base and n == replicas0 and (n == 1 or router == router0)
        found.append(
            Candidate(
                config_id(knobs, varied, (n, router), fleet_varied),
                knobs,
                engine,
                configured,
                refusal(engine, model, longest),
                n,
                router,
            )
        )
    if not any(c.configured for c in found):
        found.append(
            Candidate(
                CONFIGURED_ID,
                base,
                backend,
                True,
                refusal(backend, model, longest),
                replicas0,
                router0,
            )
        )
    if all(c.invalid for c in found):
        raise ConfigError(
            "tune.space: vLLM would refuse every configuration, e.g. "
            f"{found[0].config_id}: {found[0].invalid}"
        )
    return found


def calibration_backend(found: list[Candidate]) -> Any:
    """The one backend the profile and the engine calibration are made with: the largest token
    budget, request cap and KV cache of the space (so that its experiments and ranges cover
    every configuration's steps), prefix caching on if any configuration has it (its cached
    prefills then calibrated too), chunked prefill on if any has it."""
    valid = [c for c in found if not c.invalid]
    first = next((c.backend for c in valid if c.configured), valid[0].backend)
    return dataclasses.replace(
        fleet_backend(first, 1, DEFAULT_ROUTER),  # one engine: a fleet's engines are its copies
        max_num_batched_tokens=max(c.backend.max_num_batched_tokens for c in valid),
        max_num_seqs=max(c.backend.max_num_seqs for c in valid),
        num_gpu_blocks_override=max(c.backend.num_gpu_blocks_override for c in valid),
        enable_prefix_caching=any(c.backend.enable_prefix_caching for c in valid),
        enable_chunked_prefill=any(c.backend.enable_chunked_prefill for c in valid),
    )


def serve_flags(knobs: Mapping[str, Any]) -> list[str]:
    """``vllm serve`` flags for a configuration's knobs."""
    flags = [
        f"--max-num-seqs {knobs['max_num_seqs']}",
        f"--max-num-batched-tokens {knobs['max_num_batched_tokens']}",
        f"--num-gpu-blocks-override {knobs['num_gpu_blocks_override']}",
    ]
    for name, flag in (
        ("enable_chunked_prefill", "enable-chunked-prefill"),
        ("enable_prefix_caching", "enable-prefix-caching"),
    ):
        flags.append(f"--{flag}" if knobs[name] else f"--no-{flag}")
    return flags


def deployment(candidate: Candidate, model: str) -> dict[str, Any]:
    """How to run a configuration: the ``vllm serve`` command of each server and what routes
    between them (vLLM's own balancer behind one ``--data-parallel-size N`` server, or N servers
    behind the named router)."""
    flags = " ".join(serve_flags(candidate.knobs))
    n = candidate.replicas
    if n == 1:
        return {"servers": 1, "command": f"vllm serve {model} {flags}", "router": None}
    if candidate.router == DEFAULT_ROUTER:
        command = f"vllm serve {model} --data-parallel-size {n} {flags}"
        return {"servers": 1, "command": command, "router": "vLLM's own (data parallel)"}
    return {
        "servers": n,
        "command": f"vllm serve {model} --port <8000+k> {flags}  # k = 0..{n - 1}, one GPU each",
        "router": candidate.router,
    }
