"""Every config composes and validates; bad keys, types and ranges fail naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf

from gpu_simulate_test.config.real_bench import RealBenchStageConfig
from gpu_simulate_test.config.registry import CONFIG_DIR, STAGE_SCHEMAS, to_resolved, to_typed
from gpu_simulate_test.config.schema import (
    MIN_BLOCK_SIZE,
    ConfigError,
    HardwareConfig,
    ModelConfig,
    WorkloadStageConfig,
)
from gpu_simulate_test.config.vidur import (
    VidurConfig,
    VidurProfileStageConfig,
    VidurSimulateStageConfig,
)

MODEL_FILES = sorted((CONFIG_DIR / "model").glob("*.yaml"))
HARDWARE_FILES = sorted((CONFIG_DIR / "hardware").glob("*.yaml"))
WORKLOAD_FILES = sorted((CONFIG_DIR / "workload").glob("*.yaml"))


def test_config_groups_are_there() -> None:
    assert {p.stem for p in MODEL_FILES} >= {
        "qwen3_tiny",
        "qwen3_0_6b",
        "qwen3_1_7b",
        "qwen3_4b",
        "qwen3_8b",
    }
    assert {p.stem for p in HARDWARE_FILES} >= {"cpu", "a100", "h100", "h200"}
    assert {p.stem for p in WORKLOAD_FILES} >= {"synthetic", "trace"}


@pytest.mark.parametrize("path", MODEL_FILES, ids=lambda p: p.stem)
def test_every_model_composes_into_the_workload_stage(compose_stage, path: Path) -> None:
    cfg = to_typed(compose_stage("workload", [f"model={path.stem}"]), WorkloadStageConfig)
    assert isinstance(cfg.model, ModelConfig)
    assert cfg.model.name == path.stem


@pytest.mark.parametrize("path", HARDWARE_FILES, ids=lambda p: p.stem)
def test_every_hardware_file_validates(path: Path) -> None:
    loaded = OmegaConf.load(path)
    assert isinstance(loaded, DictConfig)
    hw = to_typed(loaded, HardwareConfig)
    assert hw.name == path.stem
    assert hw.device == ("cpu" if path.stem == "cpu" else "cuda")


def test_trace_workload_composes_with_a_file(compose_stage) -> None:
    cfg = to_typed(
        compose_stage("workload", ["workload=trace", "workload.trace_file=x.csv"]),
        WorkloadStageConfig,
    )
    assert cfg.workload.source == "trace" and cfg.workload.trace_file == "x.csv"


def test_trace_workload_without_a_file_fails(compose_stage) -> None:
    with pytest.raises(ConfigError, match="trace_file"):
        to_typed(compose_stage("workload", ["workload=trace"]), WorkloadStageConfig)


def test_real_qwen3_0_6b_numbers(compose_stage) -> None:
    m = to_typed(compose_stage("workload", ["model=qwen3_0_6b"]), WorkloadStageConfig).model
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.num_key_value_heads) == (
        28,
        1024,
        16,
        8,
    )
    assert (m.head_dim, m.intermediate_size, m.vocab_size, m.max_position_embeddings) == (
        128,
        3072,
        151936,
        40960,
    )
    assert m.tie_word_embeddings and m.rope_theta == 1_000_000
    # K and V, 28 layers, 8 kv heads, head_dim 128, 2 bytes: 114,688 bytes per token
    assert m.kv_cache_bytes_per_token == 114_688


def test_misspelt_key_fails_naming_it(compose_stage) -> None:
    with pytest.raises(ConfigCompositionException) as err:
        compose_stage("workload", ["output.rot=tmp"])
    assert "output.rot" in f"{err.value} {err.value.__cause__}"
    # the workload composes as the keys given: a misspelt one is refused when it is typed,
    # before the stage runs, naming it
    composed = compose_stage("workload", ["workload.qpss=3"])
    with pytest.raises(ConfigError, match="Key 'qpss' not in 'WorkloadConfig'"):
        to_typed(composed, STAGE_SCHEMAS["workload"])


def test_wrong_type_fails_naming_the_key(compose_stage) -> None:
    with pytest.raises(ConfigCompositionException) as err:
        compose_stage("workload", ["output.overwrite=many"])
    text = f"{err.value} {err.value.__cause__}"
    assert "output.overwrite" in text and "many" in text
    composed = compose_stage("workload", ["workload.num_requests=many"])
    with pytest.raises(ConfigError, match="many") as typed:
        to_typed(composed, STAGE_SCHEMAS["workload"])
    assert "workload.num_requests" in str(typed.value)


def test_the_workload_composes_as_given_and_is_typed_whole(compose_stage) -> None:
    """``--cfg job`` shows the workload's keys as its group and the overrides give them; any
    key may be set (one the group left out too), and the typed config and the run's record
    hold every field."""
    composed = compose_stage("workload", ["workload.session.turns.max=6"])
    assert "zipf_a" not in OmegaConf.to_yaml(composed.workload)
    cfg: WorkloadStageConfig = to_typed(composed, WorkloadStageConfig)
    assert cfg.workload.session.turns.max == 6 and cfg.workload.prompt_len.zipf_a == 1.5
    recorded = to_resolved(composed, cfg)["workload"]
    assert recorded == OmegaConf.to_container(OmegaConf.structured(cfg.workload))
    assert recorded["session"]["turns"]["max"] == 6 and "zipf_a" in recorded["prompt_len"]


def test_typo_inside_a_yaml_group_is_rejected(tmp_path: Path) -> None:
    bad = OmegaConf.create({"name": "m", "num_layer": 2})
    with pytest.raises(ConfigError, match="num_layer"):
        to_typed(bad, ModelConfig)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["workload.qps=0"], "workload.qps must be > 0"),
        (["workload.num_requests=0"], "workload.num_requests must be >= 1"),
        (["workload.prompt_len.kind=poisson"], "workload.prompt_len.kind='poisson' is not one of"),
        (
            ["workload.prompt_len.min=10", "workload.prompt_len.max=5"],
            "workload.prompt_len.max (5) must be >= workload.prompt_len.min (10)",
        ),
        (["workload.arrival.process=bursty"], "workload.arrival.process='bursty' is not one of"),
        (["model.num_key_value_heads=3"], "must be a multiple of model.num_key_value_heads"),
        (["workload.prompt_mode=images"], "workload.prompt_mode='images'"),
    ],
)
def test_range_checks_name_the_field(compose_stage, overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        to_typed(compose_stage("workload", overrides), WorkloadStageConfig)
    assert message in str(err.value)


def test_configs_are_frozen(compose_stage) -> None:
    cfg = to_typed(compose_stage("workload"), WorkloadStageConfig)
    with pytest.raises(AttributeError):
        cfg.workload.qps = 3.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("stage", "schema", "key"),
    [
        ("vidur_simulate", VidurSimulateStageConfig, "vidur.scheduler.block_size"),
        ("vidur_profile", VidurProfileStageConfig, "block_size"),
        ("real_bench", RealBenchStageConfig, "backend.block_size"),
    ],
)
def test_every_block_size_has_the_same_bound(compose_stage, stage: str, schema: type, key: str):
    """The profile's, the simulator's and the engine's KV-cache block are one quantity: one
    range check, whichever key sets it."""
    overrides = ["workload_dir=w"] if stage != "vidur_profile" else []
    to_typed(compose_stage(stage, [*overrides, f"{key}={MIN_BLOCK_SIZE}"]), schema)
    with pytest.raises(ConfigError, match=rf"{key} must be >= {MIN_BLOCK_SIZE}, got 3"):
        to_typed(compose_stage(stage, [*overrides, f"{key}=3"]), schema)


@pytest.mark.parametrize("stage", ["vidur_simulate", "pipeline", "fidelity", "capacity"])
def test_the_renamed_fast_path_is_refused_naming_lean_metrics(compose_stage, stage: str) -> None:
    overrides = ["workload_dir=w"] if stage == "vidur_simulate" else []
    with pytest.raises(ConfigError, match=r"vidur\.fast_path=True is now vidur\.lean_metrics"):
        to_typed(compose_stage(stage, [*overrides, "vidur.fast_path=true"]), STAGE_SCHEMAS[stage])


def test_a_stored_config_with_fast_path_is_refused_naming_lean_metrics() -> None:
    stored = OmegaConf.create({"event_loop": "vidur", "fast_path": False})
    with pytest.raises(ConfigError, match=r"vidur\.fast_path=False is now vidur\.lean_metrics"):
        to_typed(stored, VidurConfig)


def test_the_front_ends_input_model_is_one_of_its_names() -> None:
    assert to_typed(OmegaConf.create({"frontend_input": "queue"}), VidurConfig).frontend_input == (
        "queue"
    )
    with pytest.raises(ConfigError, match=r"frontend_input='fifo' is not one of line, queue"):
        to_typed(OmegaConf.create({"frontend_input": "fifo"}), VidurConfig)


def test_presets_load_the_shipped_group_files() -> None:
    from gpu_simulate_test.config.presets import hardware_preset, model_preset, preset_names

    assert "qwen3_8b" in preset_names("model")
    assert model_preset("qwen3_8b").tie_word_embeddings is False
    assert hardware_preset("h200").memory_gib == 141.0
    with pytest.raises(ConfigError, match=r"model=qwen9: no such option \(choices: qwen3_0_6b"):
        model_preset("qwen9")
