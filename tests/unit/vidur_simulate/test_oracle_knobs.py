"""An oracle replay takes its scheduler knobs from the run it replays (``run_meta.json``) and
refuses a knob given explicitly that contradicts the run, by name."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from gpu_simulate_test.config.registry import to_resolved, to_typed
from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.config.vidur import VidurSimulateStageConfig
from gpu_simulate_test.core.traffic.workloads import load_workload
from gpu_simulate_test.io.artifacts import ArtifactError
from gpu_simulate_test.vidur_simulate.real_run import recorded_config, with_run_knobs
from gpu_simulate_test.vidur_simulate.replay import replay_source

RUN = Path(__file__).resolve().parents[2] / "data" / "vllm" / "step_record"
"""A real vLLM run: --max-num-batched-tokens 128, --max-num-seqs 32, --block-size 32, 16 blocks."""


@pytest.fixture
def config(compose_stage: Any) -> Callable[..., VidurSimulateStageConfig]:
    def make(*overrides: str, run: Path = RUN) -> VidurSimulateStageConfig:
        composed = compose_stage(
            "vidur_simulate", ["workload_dir=w", f"step_times_from={run}", *overrides]
        )
        return to_typed(composed, VidurSimulateStageConfig)

    return make


def test_the_knobs_come_from_the_run(config: Callable[..., VidurSimulateStageConfig]) -> None:
    knobs = with_run_knobs(config()).vidur.scheduler
    assert (knobs.name, knobs.chunk_size, knobs.batch_size_cap) == ("vllm_v1", 128, 32)
    assert (knobs.block_size, knobs.num_blocks) == (32, 16)
    # the same values given again are no contradiction
    same = config("vidur.scheduler.name=vllm_v1", "vidur.scheduler.chunk_size=128")
    assert with_run_knobs(same).vidur.scheduler == knobs


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("vidur.scheduler.chunk_size=256", "chunk_size=256 contradicts .* "
         "backend.max_num_batched_tokens gives chunk_size=128"),
        ("vidur.scheduler.num_blocks=64", "num_blocks=64 contradicts .* gives num_blocks=16"),
        ("vidur.scheduler.name=orca", "name=orca contradicts .* backend vllm gives name=vllm_v1"),
    ],
)  # fmt: skip
def test_a_contradicting_knob_is_refused_by_name(
    config: Callable[..., VidurSimulateStageConfig], override: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=rf"^vidur\.scheduler\.{message}: leave vidur"):
        with_run_knobs(config(override))


def test_a_run_of_another_backend_is_refused(
    config: Callable[..., VidurSimulateStageConfig], tmp_path: Path
) -> None:
    run = tmp_path / "run"
    shutil.copytree(RUN, run, ignore=shutil.ignore_patterns("workload"))
    meta = json.loads((run / "run_meta.json").read_text())
    meta["config"]["backend"]["name"] = "hf_cb"
    (run / "run_meta.json").write_text(json.dumps(meta))
    with pytest.raises(ArtifactError, match=r"a hf_cb run .*'config\.backend\.name'"):
        with_run_knobs(config(run=run))
    del meta["config"]["backend"]  # an imported run names no backend
    (run / "run_meta.json").write_text(json.dumps(meta))
    with pytest.raises(ArtifactError, match=r"a run with no backend named \(an imported one\?\)"):
        with_run_knobs(config(run=run))


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("num_blocks", "many", r"'config\.backend\.num_blocks' \(Vidur's num_blocks\): expected a "
         r"whole number >= 1, got 'many'"),
        ("max_batch_tokens", 0, r"'config\.backend\.max_batch_tokens' \(Vidur's chunk_size\)"),
        ("enable_prefix_caching", "yes", r"'config\.backend\.enable_prefix_caching': expected "
         r"true or false"),
        (None, "vllm", r"'config\.backend': expected the backend's knobs as an object"),
        ("", "vllm", r"'config': expected the run's config as an object"),
    ],
)  # fmt: skip
def test_a_garbled_knob_of_the_run_is_named(
    config: Callable[..., VidurSimulateStageConfig],
    tmp_path: Path,
    field: str | None,
    value: object,
    message: str,
) -> None:
    # a garbled num_blocks was skipped: the replay ran on a cache sized from device memory
    run = tmp_path / "run"
    shutil.copytree(RUN, run, ignore=shutil.ignore_patterns("workload"))
    meta = json.loads((run / "run_meta.json").read_text())
    if field == "":  # the whole config garbled
        meta["config"] = value
    elif field is None:
        meta["config"]["backend"] = value
    else:
        meta["config"]["backend"][field] = value
    (run / "run_meta.json").write_text(json.dumps(meta))
    with pytest.raises(ArtifactError, match=rf"run_meta\.json, field {message}"):
        with_run_knobs(config(run=run))


def test_the_recorded_config_is_the_one_simulated(compose_stage: Any) -> None:
    composed = compose_stage("vidur_simulate", ["workload_dir=w", f"step_times_from={RUN}"])
    cfg = to_typed(composed, VidurSimulateStageConfig)
    resolved = to_resolved(composed, cfg)
    effective = with_run_knobs(cfg)
    recorded = recorded_config(resolved, effective)
    assert recorded["vidur"]["scheduler"] == dataclasses.asdict(effective.vidur.scheduler)
    assert recorded["vidur"]["scheduler"]["name"] == "vllm_v1"
    assert list(recorded["vidur"]["scheduler"]) == list(resolved["vidur"]["scheduler"])
    # only the scheduler changes, and the composed config is left as it was
    assert {k: v for k, v in recorded.items() if k != "vidur"} == {
        k: v for k, v in resolved.items() if k != "vidur"
    }
    assert resolved["vidur"]["scheduler"]["name"] == "sarathi"


def test_without_a_replay_nothing_changes(compose_stage: Any) -> None:
    cfg = to_typed(compose_stage("vidur_simulate", ["workload_dir=w"]), VidurSimulateStageConfig)
    assert with_run_knobs(cfg) is cfg
    resolved = to_resolved(compose_stage("vidur_simulate", ["workload_dir=w"]), cfg)
    assert recorded_config(resolved, cfg) == resolved


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("vidur.step_time_scale=1.1", r"vidur\.step_time_scale=1\.1 would change them"),
        ("vidur.frontend_time_scale=1.1", r"vidur\.frontend_time_scale=1\.1 would do nothing"),
    ],
)
def test_a_scale_an_oracle_replay_cannot_honour_is_refused(
    config: Callable[..., VidurSimulateStageConfig], override: str, message: str
) -> None:
    """The replay runs the engine's own step times and no front end: a scale of either would
    change them or do nothing, and is refused by name."""
    with pytest.raises(ConfigError, match=message):
        config(override)


def test_a_garbled_step_of_the_run_is_named(tmp_path: Path) -> None:
    # a requests cell without its tokens failed mid-replay: "not enough values to unpack"
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    schedule = pd.read_csv(run / "engine_schedule.csv")
    schedule.loc[5, "requests"] = "3:12 zz"
    schedule.to_csv(run / "engine_schedule.csv", index=False)
    workload = load_workload(run / "workload")
    scheduled = workload.intervals["arrival_time_s"].to_numpy(dtype=float)
    with pytest.raises(
        ArtifactError, match=r"engine_schedule\.csv: row 6, column 'requests': 'zz' is not"
    ):
        replay_source(str(run), workload, scheduled)
