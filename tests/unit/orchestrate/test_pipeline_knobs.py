"""The real engine's knobs → Vidur's, and the profile ranges the pipeline asks for."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException

from gpu_simulate_test.config.backends import (
    HfCbBackendConfig,
    HfGenerateBackendConfig,
    OpenAIBackendConfig,
)
from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.registry import to_typed
from gpu_simulate_test.config.schema import ConfigError, OutputConfig
from gpu_simulate_test.config.vidur import ProfileRangesConfig, VidurSchedulerConfig
from gpu_simulate_test.core.engines.knobs import derive_scheduler, knob_mismatches
from gpu_simulate_test.orchestrate.profiling import _knobs_apart, profile_ranges
from gpu_simulate_test.vidur_simulate.plan import Requirements


def test_hf_cb_maps_to_sarathi_knob_for_knob() -> None:
    backend = HfCbBackendConfig(
        max_num_batched_tokens=384, max_num_seqs=12, num_gpu_blocks_override=99, block_size=32
    )
    sched, derived = derive_scheduler(backend, VidurSchedulerConfig(name="vllm"), 500)
    assert derived
    assert (sched.name, sched.chunk_size, sched.batch_size_cap) == ("sarathi", 384, 12)
    assert (sched.block_size, sched.num_blocks) == (32, 99)
    assert knob_mismatches({"name": "hf_cb", **vars(backend)}, vars(sched)) == {}


def test_hf_generate_is_batch_cap_one_without_chunking() -> None:
    sched, derived = derive_scheduler(HfGenerateBackendConfig(), VidurSchedulerConfig(), 700)
    assert derived and sched.batch_size_cap == 1 and sched.chunk_size == 700


def test_openai_keeps_the_given_scheduler_and_mismatches_are_named() -> None:
    base = VidurSchedulerConfig(batch_size_cap=8)
    assert derive_scheduler(OpenAIBackendConfig(), base, 10) == (base, False)
    found = knob_mismatches(
        {"name": "hf_cb", "max_num_batched_tokens": 256, "max_num_seqs": 32, "block_size": 16,
         "num_gpu_blocks_override": 512},
        {"name": "sarathi", "chunk_size": 512, "batch_size_cap": 32, "block_size": 16},
        num_blocks=512,
    )  # fmt: skip
    assert found == {"max_num_batched_tokens ↔ chunk_size": (256, 512)}


def test_profile_ranges_widen_to_the_needs() -> None:
    needs = Requirements(
        max_request_tokens=300, max_prompt_tokens=200, max_batch_tokens=256, max_batch_size=40,
        max_prefill_chunk=256,
    )  # fmt: skip
    base = ProfileRangesConfig(max_num_tokens=128, max_batch_size=32, max_prefill_chunk=512,
                               max_kv_cache_size=256)  # fmt: skip
    got = profile_ranges(base, needs)
    assert (got.max_num_tokens, got.max_batch_size, got.max_prefill_chunk) == (256, 40, 512)
    assert got.max_kv_cache_size == 300
    assert profile_ranges(ProfileRangesConfig(max_kv_cache_size=0), needs).max_kv_cache_size == 0


def test_pipeline_config_is_a_pipeline_stage(compose_stage) -> None:
    """The schema says which stage a config drives; there is no ``stage.run_type`` to set."""
    typed = to_typed(compose_stage("pipeline"), PipelineStageConfig)
    assert isinstance(typed, PipelineStageConfig) and typed.model.name == "qwen3_tiny"
    with pytest.raises(ConfigCompositionException, match=r"stage"):
        compose_stage("pipeline", ["stage.run_type=pipeline"])


def test_a_bundle_calibrated_otherwise_is_not_reused(tmp_path: Path) -> None:
    """The engine calibration must be this code's version, for this backend and its knobs."""
    import dataclasses

    from gpu_simulate_test.calibration.record import CALIBRATION_VERSION
    from gpu_simulate_test.config.presets import hardware_preset, model_preset
    from gpu_simulate_test.core.profiling.bundle import ENGINE_STEPS_TABLE, load_bundle
    from gpu_simulate_test.io import layout
    from gpu_simulate_test.io.artifacts import as_stored_json, read_json, write_csv, write_json
    from gpu_simulate_test.orchestrate.configs import engine_calibration
    from gpu_simulate_test.orchestrate.profiling import calibration_misfits
    from tests.unit.calibration.test_engine_overhead import steps
    from tests.vidur_bundle_factory import write_synthetic_bundle

    cfg = PipelineStageConfig(
        model=model_preset("qwen3_tiny"),
        hardware=hardware_preset("cpu"),
        backend=HfCbBackendConfig(),
        output=OutputConfig(),
    )
    path = write_synthetic_bundle(tmp_path, cfg.model, points=6)
    assert calibration_misfits(cfg, load_bundle(path)) == [
        "no engine calibration for backend hf_cb"
    ]
    write_csv(path / layout.ENGINE_STEPS, steps(), ENGINE_STEPS_TABLE)
    meta = read_json(path / layout.BUNDLE_META)
    settings = as_stored_json(dataclasses.asdict(engine_calibration(cfg)))

    def calibrated(**info: object) -> list[str]:
        write_json(path / layout.BUNDLE_META, {**meta, "engine_calibration": {"hf_cb": info}})
        return calibration_misfits(cfg, load_bundle(path))

    assert "version 1" in calibrated(version=1, settings=settings)[0]
    assert calibrated(version=CALIBRATION_VERSION, settings=settings) == []
    other = {**settings, "backend": {**settings["backend"], "max_num_seqs": 8}}
    assert calibrated(version=CALIBRATION_VERSION, settings=other) == [
        "engine calibration of hf_cb was made with other backend (max_num_seqs 8, here 32)"
    ]
    # one recorded under the knobs' old names stands for the same knobs under vLLM's names
    renamed = {
        "max_num_batched_tokens": "max_batch_tokens",
        "max_num_seqs": "max_requests_per_batch",
    }
    old = {renamed.get(k, k): v for k, v in settings["backend"].items()}
    assert "max_batch_tokens" in old
    assert calibrated(version=CALIBRATION_VERSION, settings={**settings, "backend": old}) == []
    old_other = {**old, "max_requests_per_batch": 8}
    assert calibrated(version=CALIBRATION_VERSION, settings={**settings, "backend": old_other})


def test_a_vllm_calibration_is_reused_only_for_the_same_vllm_version(tmp_path: Path) -> None:
    """A calibration through the pipeline's own server (another port) stands for the engine;
    one made on another vLLM version does not."""
    import dataclasses

    from gpu_simulate_test.calibration.record import CALIBRATION_VERSION
    from gpu_simulate_test.config.backends import ServerConfig, VllmBackendConfig
    from gpu_simulate_test.config.presets import hardware_preset, model_preset
    from gpu_simulate_test.core.engines.vllm_knobs import vllm_version
    from gpu_simulate_test.core.profiling.bundle import ENGINE_STEPS_TABLE, load_bundle
    from gpu_simulate_test.io import layout
    from gpu_simulate_test.io.artifacts import as_stored_json, read_json, write_csv, write_json
    from gpu_simulate_test.orchestrate.configs import engine_calibration
    from gpu_simulate_test.orchestrate.profiling import calibration_misfits
    from tests.unit.calibration.test_engine_overhead import steps
    from tests.vidur_bundle_factory import write_synthetic_bundle

    backend = VllmBackendConfig(block_size=32, server=ServerConfig(kind="vllm"))
    cfg = PipelineStageConfig(
        model=model_preset("qwen3_tiny"),
        hardware=hardware_preset("cpu"),
        backend=backend,
        output=OutputConfig(),
    )
    path = write_synthetic_bundle(tmp_path, cfg.model, points=6)
    write_csv(path / layout.ENGINE_STEPS, steps(), ENGINE_STEPS_TABLE)
    meta = read_json(path / layout.BUNDLE_META)
    shared = dataclasses.replace(
        backend,
        base_url="http://127.0.0.1:41234",
        server=ServerConfig(kind="external", log_file="tmp/pipeline/x/server.log"),
    )
    settings = as_stored_json(
        dataclasses.asdict(engine_calibration(dataclasses.replace(cfg, backend=shared)))
    )

    def calibrated(version: str | None) -> list[str]:
        info = {
            "version": CALIBRATION_VERSION,
            "settings": settings,
            "engine": {"vllm_version": version},
        }
        write_json(path / layout.BUNDLE_META, {**meta, "engine_calibration": {"vllm": info}})
        return calibration_misfits(cfg, load_bundle(path))

    installed = vllm_version()
    if installed is None:
        pytest.skip("needs vllm installed")
    assert calibrated(installed) == []
    assert calibrated("0.1.0") == [
        f"engine calibration of vllm was made on vLLM 0.1.0, this is {installed}"
    ]
    # a calibration recorded before a knob existed stands for that knob's default
    settings["backend"].pop("gpu_memory_utilization")
    assert calibrated(installed) == []
    cfg = dataclasses.replace(cfg, backend=dataclasses.replace(backend, gpu_memory_utilization=0.5))
    assert calibrated(installed) == [
        "engine calibration of vllm was made with other backend "
        "(gpu_memory_utilization 0.9, here 0.5)"
    ]


def test_an_older_calibration_is_simulated_with_and_says_what_it_lacks(tmp_path: Path) -> None:
    """A bundle calibrated by version 9 (kept from a borrowed GPU): the pipeline, which can
    calibrate, does so again; a sim phase, which cannot, simulates with it and names what
    versions 10 to 12 measure that it does not."""
    import dataclasses

    from gpu_simulate_test.calibration.record import CALIBRATION_VERSION, measured_since
    from gpu_simulate_test.config.presets import hardware_preset, model_preset
    from gpu_simulate_test.core.profiling.bundle import ENGINE_STEPS_TABLE, load_bundle
    from gpu_simulate_test.io import layout
    from gpu_simulate_test.io.artifacts import as_stored_json, read_json, write_csv, write_json
    from gpu_simulate_test.orchestrate.configs import engine_calibration
    from gpu_simulate_test.orchestrate.profiling import calibration_misfits, older_calibration
    from tests.unit.calibration.test_engine_overhead import steps
    from tests.vidur_bundle_factory import write_synthetic_bundle

    assert CALIBRATION_VERSION == 21, "extend MEASURED_SINCE with what the new version measures"
    backend = HfCbBackendConfig(max_num_batched_tokens=128, max_num_seqs=8)
    cfg = PipelineStageConfig(
        model=model_preset("qwen3_tiny"),
        hardware=hardware_preset("cpu"),
        backend=backend,
        output=OutputConfig(),
        profiling_root=str(tmp_path),
    )
    path = write_synthetic_bundle(tmp_path, cfg.model, points=6)
    write_csv(path / layout.ENGINE_STEPS, steps(), ENGINE_STEPS_TABLE)
    settings = as_stored_json(dataclasses.asdict(engine_calibration(cfg)))
    meta = read_json(path / layout.BUNDLE_META)
    info = {"version": 9, "settings": settings, "engine": {}}
    write_json(path / layout.BUNDLE_META, {**meta, "engine_calibration": {"hf_cb": info}})
    bundle = load_bundle(path)
    assert calibration_misfits(cfg, bundle) == [
        "engine calibration of hf_cb is version 9, this code calibrates version 21"
    ]
    assert calibration_misfits(cfg, bundle, accept_older=True) == []
    note = older_calibration(cfg)
    assert note is not None and "is version 9, this code calibrates version 21" in note
    assert "the client's sends beside the replays' steps" in note
    assert "first chunk" in note and "an idle engine" in note and "recorded steps" in note
    assert "a replay at 2% of capacity" in note
    assert "how far into its step each of the replays' sends fell" in note
    assert "a busy engine's first token's way back" in note
    assert "late stamps read as drains" in note and "no write between two steps" in note
    assert "prefills over a cached prefix" in note and "bursts of 2, 4 and 8 prompts" in note
    assert "replays under load" not in note  # version 9 has them
    assert measured_since(5)[0] == "what version 6 added (CALIBRATION_VERSION)"
    assert measured_since(2)[0] == "what versions 3 to 6 added (CALIBRATION_VERSION)"
    assert measured_since(CALIBRATION_VERSION) == []
    assert older_calibration(dataclasses.replace(cfg, engine_overhead=False)) is None


def test_a_fleet_s_calibration_is_its_engine_timed_beside_the_others(tmp_path: Path) -> None:
    """``backend.servers=2 calibrate_beside_neighbours=true`` reuses only a calibration that
    timed the engine beside one other server (``engine.neighbours``), whatever its router; one
    engine timed alone does not stand for it, nor a fleet's calibration for one server."""
    import dataclasses

    from gpu_simulate_test.calibration.record import CALIBRATION_VERSION
    from gpu_simulate_test.config.backends import VllmBackendConfig
    from gpu_simulate_test.config.presets import hardware_preset, model_preset
    from gpu_simulate_test.core.engines.vllm_knobs import vllm_version
    from gpu_simulate_test.core.profiling.bundle import ENGINE_STEPS_TABLE, load_bundle
    from gpu_simulate_test.io import layout
    from gpu_simulate_test.io.artifacts import as_stored_json, read_json, write_csv, write_json
    from gpu_simulate_test.orchestrate.configs import engine_calibration
    from gpu_simulate_test.orchestrate.profiling import calibration_misfits
    from tests.unit.calibration.test_engine_overhead import steps
    from tests.vidur_bundle_factory import write_synthetic_bundle

    if vllm_version() is None:
        pytest.skip("needs vllm installed")
    fleet = VllmBackendConfig(servers=2, router="round_robin")
    cfg = PipelineStageConfig(
        model=model_preset("qwen3_tiny"),
        hardware=hardware_preset("cpu"),
        backend=fleet,
        output=OutputConfig(),
        calibrate_beside_neighbours=True,
    )
    path = write_synthetic_bundle(tmp_path, cfg.model, points=6)
    write_csv(path / layout.ENGINE_STEPS, steps(), ENGINE_STEPS_TABLE)
    meta = read_json(path / layout.BUNDLE_META)

    def calibrated(backend: VllmBackendConfig, neighbours: int | None) -> list[str]:
        made = dataclasses.replace(cfg, backend=backend)
        info = {
            "version": CALIBRATION_VERSION,
            "settings": as_stored_json(dataclasses.asdict(engine_calibration(made))),
            "engine": {"vllm_version": vllm_version(), "neighbours": neighbours},
        }
        write_json(path / layout.BUNDLE_META, {**meta, "engine_calibration": {"vllm": info}})
        return calibration_misfits(cfg, load_bundle(path))

    assert calibrated(fleet, 1) == []
    assert calibrated(dataclasses.replace(fleet, router="prefix_affinity"), 1) == []
    assert (
        "beside 0 other server(s); backend.servers=2 is timed beside 1"
        in calibrated(fleet, None)[0]
    )
    alone = dataclasses.replace(cfg, calibrate_beside_neighbours=False)  # the default
    assert calibration_misfits(alone, load_bundle(path))[0].endswith("other beside_neighbours")
    one = dataclasses.replace(cfg, backend=VllmBackendConfig())
    made = as_stored_json(dataclasses.asdict(engine_calibration(cfg)))
    info = {"version": CALIBRATION_VERSION, "settings": made,
            "engine": {"vllm_version": vllm_version(), "neighbours": 1}}  # fmt: skip
    write_json(path / layout.BUNDLE_META, {**meta, "engine_calibration": {"vllm": info}})
    assert calibration_misfits(one, load_bundle(path)) == [
        "engine calibration of vllm was made with other backend (servers 2, here 1)"
    ]


@pytest.mark.parametrize("stage", ["pipeline", "fidelity", "capacity"])
def test_a_derived_scheduler_knob_is_refused_naming_the_engine_s(compose_stage, stage) -> None:
    """One name per knob: where the simulator's scheduler is derived from the engine's knobs,
    setting it under Vidur's name too is refused, naming the engine's knob to set."""
    from gpu_simulate_test.config.capacity import CapacityStageConfig
    from gpu_simulate_test.config.fidelity import FidelityStageConfig

    schema = {"pipeline": PipelineStageConfig, "fidelity": FidelityStageConfig,
              "capacity": CapacityStageConfig}[stage]  # fmt: skip
    derived = r"chunk_size=64 \(derived from backend.max_num_batched_tokens"
    with pytest.raises(ConfigError, match=derived):
        to_typed(compose_stage(stage, ["vidur.scheduler.chunk_size=64"]), schema)
    # the engine's own name is the one to set; a knob no engine derives stays Vidur's
    to_typed(compose_stage(stage, ["backend.max_num_batched_tokens=64"]), schema)
    to_typed(compose_stage(stage, ["vidur.scheduler.watermark_blocks_fraction=0.02"]), schema)
    # an engine Vidur's schedulers do not mirror (a server you run) takes them as given
    to_typed(compose_stage(stage, ["backend=openai", "vidur.scheduler.chunk_size=64"]), schema)


def test_what_the_config_says_is_derived_is_what_is_derived() -> None:
    from gpu_simulate_test.config.backends import backend_config
    from gpu_simulate_test.config.vidur import DERIVED_SCHEDULER

    # every field away from what any backend derives, so that each derived one shows
    base = VidurSchedulerConfig(
        name="vllm_v1", chunk_size=7, batch_size_cap=3, block_size=8, num_blocks=5
    )
    for name, derived in DERIVED_SCHEDULER.items():
        vllm = {"enable_chunked_prefill": False, "enable_prefix_caching": True}
        knobs = vllm if name.startswith("vllm") else {}
        sched, _ = derive_scheduler(backend_config(name, **knobs), base, 6)
        changed = {f for f in vars(base) if getattr(sched, f) != getattr(base, f)}
        assert changed | {"name"} == set(derived) | {"name"}, name  # vllm_v1 is vLLM's own


def test_the_pipeline_simulates_two_other_seeds_unless_told_and_refuses_fewer_than_none(
    compose_stage,
) -> None:
    cfg = to_typed(compose_stage("pipeline"), PipelineStageConfig)
    assert cfg.sim_seeds == 2
    assert to_typed(compose_stage("pipeline", ["sim_seeds=0"]), PipelineStageConfig).sim_seeds == 0
    with pytest.raises(ConfigError, match="sim_seeds must be >= 0"):
        to_typed(compose_stage("pipeline", ["sim_seeds=-1"]), PipelineStageConfig)


def test_the_pipeline_simulates_at_the_real_run_s_level_unless_told(compose_stage) -> None:
    assert to_typed(compose_stage("pipeline"), PipelineStageConfig).at_level
    off = to_typed(compose_stage("pipeline", ["at_level=false"]), PipelineStageConfig)
    assert off.at_level is False


def test_a_calibration_made_with_other_knobs_names_them() -> None:
    """The first four keys apart, the calibration's value then this run's; the rest counted."""
    had = {"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "same": 0}
    wants = {"a": 9, "b": 9, "c": 9, "d": 9, "e": 9, "same": 0, "new": True}
    assert _knobs_apart({"a": 1}, {"a": 2}) == " (a 1, here 2)"
    assert _knobs_apart(had, wants) == (
        " (a 1, here 9; b 2, here 9; c 3, here 9; d 4, here 9; 2 more)"
    )
    assert _knobs_apart(1, 2) == "" and _knobs_apart({"a": 1}, {"a": 1}) == ""
