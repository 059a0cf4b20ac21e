"""``fleet.*`` in the capacity stage: the fleet searched, the backend that serves it (vLLM's
balancer is one ``--data-parallel-size N`` server), and the fleets no real engine serves refused
for a check by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpu_simulate_test.config.capacity import CapacityStageConfig
from gpu_simulate_test.config.registry import to_typed
from gpu_simulate_test.config.schema import ConfigError


def typed(compose_stage: Any, *overrides: str) -> CapacityStageConfig:
    config = to_typed(compose_stage("capacity", list(overrides)), CapacityStageConfig)
    assert isinstance(config, CapacityStageConfig)
    return config


def test_vllm_s_balancer_is_one_data_parallel_server(compose_stage: Any) -> None:
    cfg = typed(compose_stage, "fleet.replicas=2", "capacity.verify=true")
    assert cfg.fleet_of().replicas == 2 and cfg.fleet_of().router == "vllm_dp"
    assert cfg.backend.data_parallel_size == 2  # type: ignore[attr-defined]
    # the old spelling names the same fleet
    old = typed(compose_stage, "backend.data_parallel_size=2", "capacity.verify=true")
    assert old.fleet_of() == cfg.fleet_of() and old.pipeline().backend == cfg.pipeline().backend
    one = typed(compose_stage)
    assert one.fleet_of().replicas == 1 and one.backend.data_parallel_size == 1  # type: ignore[attr-defined]


def test_a_fleet_simulated_only_is_one_engine_in_either_spelling(compose_stage: Any) -> None:
    """Without a real check (the default) the calibration times one engine, the fleet copies
    it: ``backend.data_parallel_size=N`` as ``fleet.replicas=N``."""
    new, old = (
        typed(compose_stage, "fleet.replicas=2"),
        typed(compose_stage, "backend.data_parallel_size=2"),
    )
    for cfg in (new, old):
        assert cfg.fleet_of().replicas == 2 and cfg.fleet_of().router == "vllm_dp"
        assert cfg.backend.data_parallel_size == 1  # type: ignore[attr-defined]
    assert old.pipeline().backend == new.pipeline().backend


def test_another_router_is_n_servers_behind_the_client_s_router(compose_stage: Any) -> None:
    cfg = typed(compose_stage, "fleet.replicas=4", "fleet.router=round_robin")
    assert cfg.fleet_of().router == "round_robin" and cfg.fleet_of().replicas == 4
    assert cfg.backend.data_parallel_size == 1  # type: ignore[attr-defined]  # N servers, not one
    # checked on real servers: N vLLM servers behind the client's own router
    checked = typed(compose_stage, "fleet.replicas=2", "fleet.router=prefix_affinity",
                    "capacity.verify=true")  # fmt: skip
    b = checked.backend
    assert (b.servers, b.router, b.data_parallel_size) == (2, "prefix_affinity", 1)  # type: ignore[attr-defined]
    assert checked.pipeline().backend == b
    with pytest.raises(ConfigError, match=r"simulate it alone with capacity\.verify=false"):
        typed(compose_stage, "fleet.replicas=2", "fleet.router=round_robin",
              "backend=hf_cb", "capacity.verify=true")  # fmt: skip
    with pytest.raises(ConfigError, match="name two fleets"):
        typed(compose_stage, "fleet.replicas=4", "backend.data_parallel_size=2")
    with pytest.raises(ConfigError, match=r"fleet\.router"):
        typed(compose_stage, "fleet.replicas=2", "fleet.router=nearest")


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("fleet.poll_s=inf", r"fleet\.poll_s must be a finite"),
        ("fleet.poll_s=nan", r"fleet\.poll_s must be a finite"),
        ("fleet.router_seed=-1", r"fleet\.router_seed must be >= 0"),
    ],
)
def test_a_fleet_s_scrape_and_seed_are_refused_with_the_config(
    compose_stage: Any, override: str, named: str
) -> None:
    # refused when the config is read, before a run directory is made (the simulation's own
    # check came only after the run had started, leaving a failed run under its id)
    with pytest.raises(ConfigError, match=named):
        typed(compose_stage, "fleet.replicas=2", "fleet.router=prefix_affinity", override)


def test_a_simulated_only_fleet_behind_vllm_s_balancer_calibrates_one_engine(
    compose_stage: Any,
) -> None:
    # nothing checked on a real engine: the fleet is one engine's step model copied N times,
    # so the engine calibrated (and served for its calibration) is one engine, as a tune's
    # fleets are, not a --data-parallel-size N server (8 engines on this host's cores, or 8
    # GPUs to size a fleet of 8)
    cfg = typed(compose_stage, "fleet.replicas=8")
    assert cfg.fleet_of().replicas == 8 and cfg.fleet_of().router == "vllm_dp"
    assert cfg.backend.data_parallel_size == 1  # type: ignore[attr-defined]
    assert cfg.pipeline().backend == typed(compose_stage).pipeline().backend


class _Stop(Exception):
    pass


@pytest.mark.parametrize(("overrides", "requests"), [((), 1000), (("fleet.replicas=4",), 4000)])
def test_a_fleet_judges_as_many_requests_per_engine_as_one_engine(
    compose_stage: Any,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    overrides: tuple[str, ...],
    requests: int,
) -> None:
    # at N times one engine's rate, N times the requests: each engine's window as long as one
    # engine's (the whole 1000 at 4 times the rate judged each engine on 250, a quarter of the
    # window, and answered 6% higher)
    from gpu_simulate_test.capacity import stage

    made: list[int] = []

    def workload_made(cfg: Any, inner: Any, r: Any) -> Any:
        made.append(inner.workload.num_requests)
        raise _Stop

    monkeypatch.setattr(stage, "bundle_and_workload", workload_made)
    cfg = typed(compose_stage, *overrides, f"output.root={tmp_path}", "output.run_id=c")
    with pytest.raises(_Stop):
        stage.run(cfg, {})
    assert made == [requests]


def test_the_real_phase_records_a_fleets_workload_at_its_size(compose_stage: Any) -> None:
    from gpu_simulate_test.capacity.split import recorded_config

    cfg = typed(
        compose_stage, "fleet.replicas=2", "capacity.phase=real", "workload.num_requests=50"
    )
    assert recorded_config(cfg)["workload"]["num_requests"] == 100  # as its workload_dir holds
    one = typed(compose_stage, "capacity.phase=real", "workload.num_requests=50")
    assert recorded_config(one)["workload"]["num_requests"] == 50
