"""What the stage needs for vLLM's V1 scheduler and for an oracle replay of a real vLLM run.

``step_times_from=<real_bench run>``: the run's engine arrivals (when its engine queued each
request) and its steps (:mod:`.oracle`) become the simulation's arrivals and step clock, its
client arrivals the client clock's; the simulation's ``engine_schedule.csv`` then lines up with
the run's step for step (``compare``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from gpu_simulate_test.config.vidur import VidurSchedulerConfig
from gpu_simulate_test.core.engines.knobs import VLLM_BACKENDS
from gpu_simulate_test.core.engines.router_reads import read_router_reads
from gpu_simulate_test.core.engines.step_record import parse_requests
from gpu_simulate_test.core.traffic.workloads import LoadedWorkload
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import ArtifactError, read_csv
from gpu_simulate_test.io.schemas import ENGINE_SCHEDULE, ENGINE_STEP_LOG, FLEET_COLUMN
from gpu_simulate_test.simulator.types import NAME, V1Params
from gpu_simulate_test.vidur_simulate import oracle


@dataclass(frozen=True)
class ReplaySource:
    """A real run to replay: arrivals on both clocks and its step clock."""

    path: Path
    client_arrival_s: np.ndarray
    """When the client sent each request (workload order)."""
    engine_arrival_s: np.ndarray
    """When the engine queued each request (workload order)."""
    clock: oracle.OracleClock | oracle.FleetOracle
    """The run's step clock; a data-parallel run's, one per engine."""
    engine_of: np.ndarray | None = None
    """A data-parallel run: the engine that queued each request (workload order; -1: none)."""

    @property
    def engines(self) -> int:
        """The run's engines (1 unless it ran ``--data-parallel-size``)."""
        return len(self.clock.clocks) if isinstance(self.clock, oracle.FleetOracle) else 1


def v1_params(knobs: VidurSchedulerConfig, num_blocks: int) -> V1Params | None:
    """vLLM's scheduler knobs for ``vidur.scheduler.name=vllm_v1`` (None for Vidur's schedulers):
    the token budget is ``chunk_size``, the request cap ``batch_size_cap``."""
    if knobs.name != NAME:
        return None
    return V1Params(
        max_num_batched_tokens=knobs.chunk_size,
        max_num_seqs=knobs.batch_size_cap,
        block_size=knobs.block_size,
        num_blocks=num_blocks,
        enable_prefix_caching=knobs.enable_prefix_caching,
        enable_chunked_prefill=knobs.enable_chunked_prefill,
    )


def replay_source(run_dir: str, workload: LoadedWorkload, scheduled: np.ndarray) -> ReplaySource:
    """Read ``run_dir`` (a ``real_bench`` run of ``workload`` on a vLLM backend) for an oracle
    replay; ArtifactError naming the file and what is missing."""
    from gpu_simulate_test.core.run_inputs import load_run

    run = load_run(run_dir, "real_bench")
    where = f"step_times_from={run_dir}"
    if run.workload_id != workload.workload_id:
        raise ArtifactError(
            f"{where} replayed workload {run.workload_id}, not {workload.workload_id} "
            f"({workload.path})"
        )
    backend = ((run.meta.get("config") or {}).get("backend") or {}).get("name")
    if backend not in VLLM_BACKENDS:
        raise ArtifactError(
            f"{where}: a {backend} run; an oracle replay follows vLLM's own steps (a run of "
            f"backend {' or '.join(VLLM_BACKENDS)})"
        )
    requests = run.requests.set_index("request_id")
    ids = workload.intervals["request_id"].astype(int).to_numpy()
    client = requests["arrival_time_s"].reindex(ids).to_numpy(dtype=float)
    client = np.where(np.isfinite(client), client, scheduled)
    engine = requests.get("engine_arrival_time_s")
    if engine is None or not np.isfinite(engine.to_numpy(dtype=float)).any():
        raise ArtifactError(
            f"{run.path / layout.REQUEST_METRICS}: no engine_arrival_time_s (the run has no "
            "engine clock: backend.engine_clock=false, or a server without spans or a step "
            "record); an oracle replay needs when the engine queued each request"
        )
    engine_s = engine.reindex(ids).to_numpy(dtype=float)
    known = np.isfinite(engine_s)
    delay = float(np.median(engine_s[known] - client[known]))
    engine_s = np.where(known, engine_s, client + delay)  # a failed request: the median hop
    schedule_path = run.path / layout.ENGINE_SCHEDULE
    log_path = run.path / layout.ENGINE_STEP_LOG
    if FLEET_COLUMN.name in requests.columns:
        return _fleet_source(run.path, requests, ids, client, engine_s)
    if schedule_path.is_file():
        clock = oracle.from_schedule(read_schedule(schedule_path), engine_s)
    elif log_path.is_file():
        clock = oracle.from_step_log(read_csv(log_path, ENGINE_STEP_LOG))
    else:
        raise ArtifactError(
            f"{where}: neither {layout.ENGINE_SCHEDULE} nor {layout.ENGINE_STEP_LOG} in "
            f"{run.path}: the run recorded no engine steps to time the replay by"
        )
    return ReplaySource(run.path, client, engine_s, clock)


REQUEST_ITEM = re.compile(r"\S+:\d+")
"""One item of an ``engine_schedule`` ``requests`` cell: ``request_id:tokens``."""


def read_schedule(path: Path) -> pd.DataFrame:
    """A run's ``engine_schedule.csv``, its ``requests`` cells checked item by item (a garbled
    one failed mid-replay with a bare unpacking error, naming no file)."""
    schedule = read_csv(path, ENGINE_SCHEDULE)
    for row, cell in enumerate(schedule["requests"]):
        bad = next((i for i in str(cell or "").split() if not REQUEST_ITEM.fullmatch(i)), None)
        if bad is not None:
            raise ArtifactError(
                f"{path}: row {row + 1}, column 'requests': {bad!r} is not request_id:tokens "
                "(space-separated items, tokens a whole number)"
            )
    return schedule


def _fleet_source(
    path: Path, requests: pd.DataFrame, ids: np.ndarray, client: np.ndarray, engine_s: np.ndarray
) -> ReplaySource:
    """A data-parallel run's replay source: a clock per engine from its recorded schedule."""
    schedule_path = path / layout.ENGINE_SCHEDULE
    if not schedule_path.is_file():
        raise ArtifactError(
            f"{path}: a data-parallel run (request_metrics.csv has an engine column) without "
            f"{layout.ENGINE_SCHEDULE}: a fleet's oracle replay needs each engine's recorded "
            "steps (a server started by real_bench with backend.engine_clock=true)"
        )
    schedule = read_schedule(schedule_path)
    if FLEET_COLUMN.name not in schedule.columns:
        raise ArtifactError(
            f"{schedule_path}: no engine column, while request_metrics.csv has one: the "
            "schedule of a data-parallel run says each step's engine"
        )
    engine_of = requests[FLEET_COLUMN.name].reindex(ids).to_numpy(dtype=float)
    engine_of = np.where(np.isfinite(engine_of), engine_of, -1).astype(np.int64)
    engines = int(max(engine_of.max(initial=0), schedule[FLEET_COLUMN.name].max()) + 1)
    reads = read_router_reads(path, ids)
    routed = client  # the router decides when the client sends
    if reads is not None:  # ... as it recorded, where it did
        routed = np.where(np.isfinite(reads.routed_s), reads.routed_s, client)
    clock = oracle.fleet_from_schedule(
        schedule, engine_s, engine_of, engines, routed, None if reads is None else reads.loads
    )
    return ReplaySource(path, client, engine_s, clock, engine_of)


def schedule_with_ids(schedule: pd.DataFrame, ids: np.ndarray) -> pd.DataFrame:
    """A simulated schedule whose ``requests`` name the trace's rows, with the workload's
    request ids instead (``row:tokens`` → ``request_id:tokens``); the schedule itself where
    each row's id is its position."""
    if np.array_equal(ids, np.arange(len(ids))):
        return schedule

    def named(items: str) -> str:
        return " ".join(f"{int(ids[int(row)])}:{tokens}" for row, tokens in parse_requests(items))

    frame = schedule.copy()
    frame["requests"] = frame["requests"].map(named)
    return frame
