"""What the pipeline refuses before it runs anything, and what it keeps when it profiles again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.registry import to_typed
from gpu_simulate_test.core.engines.knobs import derive_scheduler
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import read_json, write_json
from gpu_simulate_test.io.runs import RunExistsError
from gpu_simulate_test.orchestrate.profiling import (
    DisturbedProfileError,
    bundle_misfits,
    check_profile_quality,
    profile_config,
)
from gpu_simulate_test.pipeline.stage import claim_outputs, run
from gpu_simulate_test.vidur_simulate.plan import Requirements
from tests.vidur_bundle_factory import SyntheticRanges, write_synthetic_bundle

NEEDS = Requirements(
    max_request_tokens=160, max_prompt_tokens=128, max_batch_tokens=256, max_batch_size=32,
    max_prefill_chunk=256,
)  # fmt: skip
"""What the pipeline's default workload asks of the bundle (profile.* of configs/pipeline.yaml)."""


@pytest.fixture
def pipeline_cfg(compose_stage, tmp_path: Path):
    """``pipeline_cfg(*overrides)``: configs/pipeline.yaml typed, everything under ``tmp_path``."""

    def _cfg(*overrides: str) -> PipelineStageConfig:
        where = [f"output.root={tmp_path / 'tmp'}", f"profiling_root={tmp_path / 'profiles'}"]
        composed = compose_stage("pipeline", [*where, "progress=false", *overrides])
        return to_typed(composed, PipelineStageConfig)

    return _cfg


def _earlier_run(root: Path, stage: str, run_id: str) -> Path:
    path = layout.run_dir(root, stage, run_id)
    path.mkdir(parents=True)
    (path / layout.RUN_META).write_text(json.dumps({"stage": stage, "status": "complete"}))
    (path / "sentinel.txt").write_text("earlier run\n")
    return path


def _stage_dirs(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.glob("*/*"))


def test_reprofiling_keeps_the_wider_ranges_of_the_bundle_it_replaces(pipeline_cfg) -> None:
    cfg = pipeline_cfg("workload.num_requests=4")
    wide = SyntheticRanges(max_num_tokens=4096, max_batch_size=64, max_prefill_chunk=1024,
                           max_kv_cache_size=2048)  # fmt: skip
    write_synthetic_bundle(Path(cfg.profiling_root), cfg.model, ranges=wide, points=6)
    got = profile_config(cfg, cfg.vidur.scheduler, NEEDS, Path("wl")).profile
    assert (got.max_num_tokens, got.max_batch_size) == (4096, 64)
    assert (got.max_prefill_chunk, got.max_kv_cache_size) == (1024, 2048)
    assert got.num_points == cfg.profile.num_points  # only the maxima change


def test_reprofiling_over_an_unreadable_bundle_profiles_what_is_needed(pipeline_cfg) -> None:
    cfg = pipeline_cfg()
    path = write_synthetic_bundle(Path(cfg.profiling_root), cfg.model, points=6)
    (path / layout.BUNDLE_META).write_text("{not json")
    got = profile_config(cfg, cfg.vidur.scheduler, NEEDS, Path("wl")).profile
    assert (got.max_num_tokens, got.max_batch_size, got.max_prefill_chunk) == (256, 32, 256)
    assert got.max_kv_cache_size == 256


def test_an_earlier_profile_run_is_not_overwritten(pipeline_cfg, tmp_path: Path) -> None:
    """The profile stage gets overwrite=true for the bundle; its run directory must survive."""
    root = tmp_path / "tmp"
    earlier = _earlier_run(root, "vidur_profile", "ow1")
    cfg = pipeline_cfg("output.run_id=ow1", "workload.num_requests=4", "reuse_profile=false")
    with pytest.raises(RunExistsError, match=r"vidur_profile/ow1 already exists"):
        run(cfg, {"test": "ow1"})
    assert (earlier / "sentinel.txt").read_text() == "earlier run\n"
    assert _stage_dirs(root) == ["vidur_profile/ow1"]  # nothing else was created


def test_existing_stage_runs_are_refused_before_any_stage_runs(pipeline_cfg, tmp_path) -> None:
    root = tmp_path / "tmp"
    _earlier_run(root, "real_bench", "late1")
    _earlier_run(root, "compare", "late1")
    cfg = pipeline_cfg("output.run_id=late1", "workload.num_requests=4")
    with pytest.raises(RunExistsError) as caught:
        run(cfg, {"test": "late1"})
    message = str(caught.value)
    assert "real_bench/late1" in message and "compare/late1" in message, message
    assert "nothing was run" in message
    assert _stage_dirs(root) == ["compare/late1", "real_bench/late1"]
    # overwrite=true lets the pipeline replace them (the check itself passes), its old answer
    # gone first: an overwrite interrupted before its compare leaves none over replaced stages
    claim_outputs(pipeline_cfg("output.run_id=late1", "output.overwrite=true"), "late1")
    assert _stage_dirs(root) == ["real_bench/late1"]
    # the repeat and the re-runs go in the pipeline's own directory: a run of another
    # pipeline's naming in real_bench/ is not in the way
    _earlier_run(root, "real_bench", "late2-r2-rerun1")
    claim_outputs(pipeline_cfg("output.run_id=late2"), "late2")
    _earlier_run(root, "pipeline", "late2")
    with pytest.raises(RunExistsError, match="pipeline/late2"):
        claim_outputs(pipeline_cfg("output.run_id=late2"), "late2")


def test_an_existing_profile_run_counts_only_when_the_pipeline_will_profile(
    pipeline_cfg, tmp_path: Path
) -> None:
    root = tmp_path / "tmp"
    _earlier_run(root, "vidur_profile", "r1")
    # a bundle that fits the workload (no engine calibration asked for): it is reused
    # (hf_cb: the synthetic bundle has hf_cb's block size)
    cfg = pipeline_cfg(
        "output.run_id=r1", "workload.num_requests=4", "engine_overhead=false", "backend=hf_cb"
    )
    write_synthetic_bundle(Path(cfg.profiling_root), cfg.model, points=6)
    claim_outputs(cfg, "r1")
    no_reuse = pipeline_cfg(
        "output.run_id=r1", "engine_overhead=false", "reuse_profile=false", "backend=hf_cb"
    )
    with pytest.raises(RunExistsError, match="vidur_profile/r1"):
        claim_outputs(no_reuse, "r1")
    calibrated = pipeline_cfg("output.run_id=r1", "workload.num_requests=4", "backend=hf_cb")
    with pytest.raises(RunExistsError, match="vidur_profile/r1"):
        claim_outputs(calibrated, "r1")


def test_a_bundle_with_a_planted_outlier_is_profiled_again(pipeline_cfg) -> None:
    """Its meta.json says nothing, its mlp.csv has an op 500x slower on 4 tokens than on more:
    not reused in silence, whatever profile warnings the run accepts."""
    from tests.unit.io.test_bundle_contract import plant_outlier

    cfg = pipeline_cfg("engine_overhead=false")
    scheduler = derive_scheduler(cfg.backend, cfg.vidur.scheduler, 128)[0]
    ranges = SyntheticRanges(block_size=scheduler.block_size)
    path = write_synthetic_bundle(Path(cfg.profiling_root), cfg.model, ranges=ranges, points=6)
    assert bundle_misfits(cfg, scheduler, NEEDS) == []
    tokens = plant_outlier(path)
    (misfit,) = bundle_misfits(cfg, scheduler, NEEDS)
    assert f"{path / layout.MLP_PROFILE}: mlp_up_proj takes" in misfit
    assert f"at num_tokens={tokens} but" in misfit and "profile again" in misfit
    accepting = pipeline_cfg("engine_overhead=false", "accept_profile_warnings=true")
    assert bundle_misfits(accepting, scheduler, NEEDS) == [misfit]


def test_a_disturbed_bundle_is_profiled_again_unless_accepted(pipeline_cfg) -> None:
    cfg = pipeline_cfg("engine_overhead=false")
    scheduler = derive_scheduler(cfg.backend, cfg.vidur.scheduler, 128)[0]
    ranges = SyntheticRanges(block_size=scheduler.block_size)
    path = write_synthetic_bundle(Path(cfg.profiling_root), cfg.model, ranges=ranges, points=6)
    meta = read_json(path / layout.BUNDLE_META)
    assert bundle_misfits(cfg, scheduler, NEEDS) == []  # a clean bundle is reused
    meta["quality_warnings"] = ["mlp.csv: mlp_up_proj takes 20.8 ms at num_tokens=6 ..."]
    write_json(path / layout.BUNDLE_META, meta)
    assert bundle_misfits(cfg, scheduler, NEEDS) == [
        "its profile carries 1 quality warning(s) (timings disturbed by a busy machine; "
        "meta.json quality_warnings)"
    ]
    accepting = pipeline_cfg("engine_overhead=false", "accept_profile_warnings=true")
    assert bundle_misfits(accepting, scheduler, NEEDS) == []
    # a fresh profile that still carries them stops the pipeline, naming the way out
    with pytest.raises(DisturbedProfileError, match="accept_profile_warnings=true"):
        check_profile_quality(cfg, path)
    check_profile_quality(accepting, path)
