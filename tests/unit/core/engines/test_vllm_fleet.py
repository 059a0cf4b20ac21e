"""A fleet of vLLM servers behind the client's router, its pieces: each server's cores, its
config (one engine, a free port), the router the simulator runs too, the servers' tables merged
as a data-parallel server's are, and the settings refused by name."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from gpu_simulate_test.config.backends import VllmBackendConfig
from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.core.engines import make_backend
from gpu_simulate_test.core.engines.records import BenchRequest, Recorder
from gpu_simulate_test.core.engines.vllm import VllmBackend
from gpu_simulate_test.core.engines.vllm_fleet import (
    VllmFleetBackend,
    fleet_record,
    merged_tables,
    server_binds,
    server_gpu,
)
from gpu_simulate_test.core.engines.vllm_neighbours import VllmNeighboursBackend
from gpu_simulate_test.core.routing import CLIENT_ROUTERS
from gpu_simulate_test.simulator.routers import ROUTERS
from tests.conftest import vllm_stage_config


def test_each_server_gets_its_own_cores() -> None:
    two = VllmBackendConfig(servers=2)
    assert server_binds(two, num_cpus=2) == ["0", "1"]
    assert server_binds(VllmBackendConfig(servers=2), num_cpus=5) == ["1-2", "3-4"]
    assert server_binds(VllmBackendConfig(servers=2, cpu_threads_bind="2|5")) == ["2", "5"]
    assert server_binds(VllmBackendConfig(servers=2, cpu_threads_bind="1")) == ["1", "1"]


def test_a_fleet_is_servers_of_one_engine_each(compose_stage) -> None:
    cfg = vllm_stage_config(compose_stage, "backend.servers=2", "backend.router=least_outstanding")
    fleet = make_backend(cfg)
    assert isinstance(fleet, VllmFleetBackend) and len(fleet.starters) == 2
    assert isinstance(make_backend(vllm_stage_config(compose_stage)), VllmBackend)
    for k, starter in enumerate(fleet.starters):
        b = starter.knobs
        assert b.servers == 1 and b.server.port == 0 and b.data_parallel_size == 1
        assert b.cpu_threads_bind == fleet.binds[k]
    assert len(set(fleet.binds)) == 2  # no two servers on the same cores


def test_the_client_routes_with_the_simulator_s_own_routers() -> None:
    for name, make in CLIENT_ROUTERS.items():  # the same classes, so the same decisions
        if name == "prefix_affinity":  # reads the load: tests/unit/core/test_prefix_affinity.py
            continue
        client, simulated = make(3, 7), ROUTERS[name](3, 7)
        assert type(client) is type(simulated)
        picks = []
        for r in range(12):
            picks.append((client.route(r, 0.0, None), simulated.route(r, 0.0, None)))  # type: ignore[arg-type]
            if r % 3 == 2:
                client.finished(r - 1, picks[-2][0], 0.0)
                simulated.finished(r - 1, picks[-2][1], 0.0)
        assert all(a == b for a, b in picks), name


def test_the_servers_tables_merge_as_a_data_parallel_server_s(tmp_path: Path) -> None:
    for k, starts in enumerate(([0.0, 0.2], [0.1, 0.3])):
        (tmp_path / f"engine{k}").mkdir()
        pd.DataFrame({"step_index": [0, 1], "start_time_s": starts}).to_csv(
            tmp_path / f"engine{k}" / "engine_schedule.csv", index=False
        )
    merged = merged_tables(tmp_path, "engine_schedule.csv", 2)
    assert merged is not None and merged.columns[0] == "engine"
    assert merged["engine"].tolist() == [0, 1, 0, 1]
    assert merged["step_index"].tolist() == [0, 0, 1, 1]  # each server's own numbering
    assert merged_tables(tmp_path, "engine_step_log.csv", 2) is None


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (("backend.servers=2", "backend.router=vllm_dp"), "vllm_dp is one server's own"),
        (("backend.servers=2", "backend.router_poll_s=0"), "router_poll_s must be > 0"),
        (("backend.servers=2", "backend.data_parallel_size=2"), "are two fleets"),
        (("backend.servers=2", "backend.server.kind=external"), "started here"),
        (("backend.servers=0",), "backend.servers must be >= 1"),
    ],
)
def test_fleets_the_client_cannot_run_are_refused(compose_stage, overrides, said) -> None:
    with pytest.raises(ConfigError, match=said):
        vllm_stage_config(compose_stage, *overrides)


def test_the_fleet_s_engine_log_sums_its_servers() -> None:
    one = {
        "engine_steps": 10,
        "prefix_cache_hit_tokens": 32,
        "prefix_cache_query_tokens": 64,
        "engine_clock": {"source": "engine_steps", "requests": 8, "steps": 10, "engines": 1},
    }
    two = {
        "engine_steps": 12,
        "prefix_cache_hit_tokens": 0,
        "prefix_cache_query_tokens": 64,
        "engine_clock": {"source": "engine_steps", "requests": 8, "steps": 12, "engines": 1},
    }
    out = fleet_record([one, two])
    assert out["engine_steps"] == 22 and out["prefix_cache_hit_rate"] == 0.25
    assert out["engine_clock"] == {
        "source": "engine_steps",
        "requests": 16,
        "steps": 22,
        "engines": 2,
    }
    assert out["servers"] == [one, two] and out["preemptions"] is None
    assert fleet_record([]) == {}


def test_on_cuda_each_server_gets_its_own_gpu(compose_stage, monkeypatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fleet = VllmFleetBackend(vllm_stage_config(compose_stage, "hardware=h100", "backend.servers=2"))
    assert fleet.binds == []  # no CPU binding on a GPU machine
    assert [s.server_env()["CUDA_VISIBLE_DEVICES"] for s in fleet.starters] == ["0", "1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    assert server_gpu(0) == "4" and server_gpu(1) == "6" and server_gpu(2) == "4"


class _Client:
    """A server's client as the neighbours' backend drives it: what it was sent, into which
    recorder."""

    def __init__(self, recorder: Recorder, steps_path: str) -> None:
        self.recorder, self.steps_path = recorder, steps_path
        self.sent: list[int] = []
        self.cancelled: list[int] = []

    def submit(self, request: BenchRequest) -> None:
        assert request.request_id in self.recorder.records
        self.sent.append(request.request_id)

    def cancel(self, request_id: int) -> None:
        self.cancelled.append(request_id)


def test_a_fleet_s_calibration_sends_every_request_to_each_server_and_times_the_first(
    compose_stage,
) -> None:
    cfg = vllm_stage_config(compose_stage, "backend.servers=2")
    backend = make_backend(cfg, calibrating=True)
    assert isinstance(backend, VllmNeighboursBackend) and len(backend.starters) == 2
    assert backend.steps_path is None  # before start: the timed server's starter's
    assert isinstance(make_backend(cfg), VllmFleetBackend)
    assert not isinstance(make_backend(cfg), VllmNeighboursBackend)
    requests = [BenchRequest(r, 4, 2, 0.0, prompt_token_ids=(1, 2, 3, 4)) for r in range(3)]
    timed = _Client(Recorder(requests), "timed.jsonl")
    neighbour = _Client(Recorder([]), "other.jsonl")
    backend.members = [timed, neighbour]  # type: ignore[list-item]
    for request in requests:
        backend.submit(request)
    backend.cancel(2)
    assert timed.sent == neighbour.sent == [0, 1, 2]
    assert timed.cancelled == neighbour.cancelled == [2]
    assert set(neighbour.recorder.records) == {0, 1, 2}  # its own recorder, not the timed one's
    assert backend.steps_path == "timed.jsonl"  # the calibration reads the timed server's
    with pytest.raises(AttributeError):
        backend._private  # noqa: B018
