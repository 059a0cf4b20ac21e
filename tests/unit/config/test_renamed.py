"""One name per knob, vLLM's own: an old name is refused where a user gives it (the command line,
Python) with the new one in the message, and a record made under the old names reads under the
new ones (a calibration's settings, a real run's ``config.backend``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_simulate_test.config.backends import (
    VllmBackendConfig,
    backend_config,
    knob_names,
    own_knobs,
)
from gpu_simulate_test.config.real_bench import RealBenchStageConfig
from gpu_simulate_test.config.registry import to_typed
from gpu_simulate_test.config.renamed import RENAMED_KNOBS, current_names
from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.config.vidur import VidurProfileStageConfig
from gpu_simulate_test.core.engines.knobs import knob_mismatches

DATA = Path(__file__).resolve().parents[2] / "data"


@pytest.mark.parametrize(("old", "new"), sorted(RENAMED_KNOBS.items()))
def test_an_old_name_on_the_command_line_is_refused_naming_the_new_one(
    compose_stage, old: str, new: str
) -> None:
    cfg = compose_stage("real_bench", ["workload_dir=w", "backend=vllm", f"backend.{old}=64"])
    with pytest.raises(ConfigError, match=rf"backend\.{old} is now backend\.{new} \(vLLM's own"):
        to_typed(cfg, RealBenchStageConfig)


def test_an_old_name_is_refused_under_its_own_path_and_in_python(compose_stage) -> None:
    cfg = compose_stage("vidur_profile", ["engine.backend.max_batch_tokens=64"])
    match = r"engine\.backend\.max_batch_tokens is now engine\.backend\.max_num_batched_tokens"
    with pytest.raises(ConfigError, match=match):
        to_typed(cfg, VidurProfileStageConfig)
    with pytest.raises(ConfigError, match=r"backend\.num_blocks is now backend\.num_gpu_blocks"):
        backend_config("vllm", num_blocks=8)


def test_every_new_name_is_a_knob_and_no_old_one_is() -> None:
    for old, new in RENAMED_KNOBS.items():
        assert new in knob_names("vllm") and new in knob_names("hf_cb")
        assert old not in knob_names("vllm") and old not in knob_names("hf_cb")


def test_a_real_run_recorded_under_the_old_names_reads_under_the_new_ones() -> None:
    # a vLLM run of this repository's test data, recorded before the rename
    meta = json.loads((DATA / "vllm" / "step_record" / "run_meta.json").read_text())
    recorded = meta["config"]["backend"]
    assert "max_batch_tokens" in recorded and "max_num_batched_tokens" not in recorded
    knobs = own_knobs(recorded)
    assert knobs["max_num_batched_tokens"] == recorded["max_batch_tokens"] == 128
    assert knobs["max_num_seqs"] == recorded["max_requests_per_batch"]
    assert not set(RENAMED_KNOBS) & set(knobs)
    typed = backend_config(**knobs)
    assert isinstance(typed, VllmBackendConfig) and typed.max_num_batched_tokens == 128
    # the knobs' check against a simulation reads it the same way
    scheduler = {"name": "vllm_v1", "chunk_size": 128, "batch_size_cap": 32}
    scheduler |= {"block_size": recorded["block_size"], "num_blocks": recorded["num_blocks"]}
    assert knob_mismatches(recorded, scheduler) == {}
    other = knob_mismatches(recorded, {**scheduler, "chunk_size": 64})
    assert other == {"max_num_batched_tokens ↔ chunk_size": (128, 64)}


def test_current_names_leaves_other_knobs_and_new_names_alone() -> None:
    assert current_names({"name": "hf_cb", "max_num_seqs": 3, "block_size": 16}) == {
        "name": "hf_cb",
        "max_num_seqs": 3,
        "block_size": 16,
    }
