"""Vidur's configs for one simulation of checked inputs (:func:`build_simulation_config`):
fresh objects each time, as Vidur mutates them."""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpu_simulate_test.config.vidur import VidurSimulateStageConfig
from gpu_simulate_test.vidur_simulate import plan
from gpu_simulate_test.vidur_simulate.inputs import Inputs


def _pin_metrics_config(out_dir: Path, chrome_trace: bool) -> Any:
    """Vidur's MetricsConfig, writing into ``out_dir`` itself, with plots and wandb off.

    Its ``__post_init__`` appends a timestamp directory and creates it; we point it back at
    ``out_dir`` and remove the empty stamped directory.
    """
    from vidur.config import MetricsConfig

    metrics = MetricsConfig(
        write_metrics=True,
        write_json_trace=False,
        enable_chrome_trace=chrome_trace,
        save_table_to_wandb=False,
        store_plots=False,  # plotly/kaleido image export; CSVs of the CDFs are still written
        store_request_metrics=True,
        store_batch_metrics=True,
        store_utilization_metrics=True,
        output_dir=str(out_dir),
    )
    stamped = Path(metrics.output_dir)
    metrics.output_dir = str(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        stamped.rmdir()
    return metrics


@dataclass(frozen=True)
class BuiltConfig:
    """A Vidur SimulationConfig and what went into it (for run_meta)."""

    simulation_config: Any
    notes: dict[str, Any]


def build_simulation_config(
    cfg: VidurSimulateStageConfig, inputs: Inputs, out_dir: Path, trace_file: Path
) -> BuiltConfig:
    """Fresh Vidur configs for one simulation (Vidur mutates CacheConfig.num_blocks in place)."""
    from vidur.config import (
        CacheConfig,
        ClusterConfig,
        ReplicaConfig,
        RoundRobinGlobalSchedulerConfig,
        SimulationConfig,
        TraceRequestGeneratorConfig,
    )
    from vidur.utils.memory_planner import MemoryPlanner

    from gpu_simulate_test.vidur_simulate.models import patch_head_dim, vidur_derived_head_dim
    from gpu_simulate_test.vidur_simulate.predictor import predictor_config, vidur_version
    from gpu_simulate_test.vidur_simulate.registration import register_vidur_extensions
    from gpu_simulate_test.vidur_simulate.schedulers import vidur_scheduler_config

    model_name, device = register_vidur_extensions(cfg.model, cfg.hardware)
    knobs = cfg.vidur.scheduler
    replica = ReplicaConfig(
        model_name=model_name,
        num_pipeline_stages=1,  # Vidur's defaults are 2 stages x TP 8 on an h100
        tensor_parallel_size=1,
        device=device.device,
        network_device=device.network_device,
    )
    head_dim_patched = patch_head_dim(replica, cfg.model)
    cache = CacheConfig(
        block_size=knobs.block_size,
        num_blocks=inputs.kv_cache.num_blocks,
        watermark_blocks_fraction=knobs.watermark_blocks_fraction,
        memory_margin_fraction=knobs.memory_margin_fraction,
    )
    scheduler = vidur_scheduler_config(knobs)
    predictor = predictor_config(
        inputs.bundle, cfg.model, cfg.vidur.predictor, inputs.bounds, knobs.block_size
    )
    memory_tokens = MemoryPlanner(replica, cache).get_max_kv_cache_size_in_tokens()
    simulation_config = SimulationConfig(
        seed=cfg.vidur.seed,
        log_level="warning",
        time_limit=0,
        cluster_config=ClusterConfig(
            num_replicas=1,
            replica_config=replica,
            cache_config=cache,
            global_scheduler_config=RoundRobinGlobalSchedulerConfig(),
            replica_scheduler_config=scheduler,
        ),
        request_generator_config=TraceRequestGeneratorConfig(
            trace_file=str(trace_file),
            date=plan.TRACE_DATE,
            prefill_scale_factor=1.0,  # Vidur's defaults (0.3, 1, 0.04) rescale the trace
            decode_scale_factor=1.0,
            time_scale_factor=1.0,
            max_tokens=inputs.max_tokens,
        ),
        execution_time_predictor_config=predictor,
        metrics_config=_pin_metrics_config(out_dir, cfg.vidur.chrome_trace),
    )
    notes = {
        "vidur_version": vidur_version(),
        "vidur_model_name": model_name,
        "vidur_device": asdict(device),
        "vidur_scheduler_type": str(scheduler.get_type()),
        "head_dim": {
            "true": cfg.model.head_dim,
            "vidur_derived": vidur_derived_head_dim(cfg.model),
            "patched": head_dim_patched,
        },
        "kv_cache": {**asdict(inputs.kv_cache), "block_size": knobs.block_size},
        "vidur_memory_bound_batch_size": int(memory_tokens // inputs.max_tokens),
        "max_tokens_per_request": inputs.max_tokens,
        "predictor_fingerprint": predictor.fingerprint,
        "predictor_cache_dir": predictor.cache_dir,
    }
    return BuiltConfig(simulation_config, notes)
