"""The vidur_profile stage: time a Qwen3 decoder layer's ops on a device into a Vidur bundle.

The bundle (``mlp.csv``, ``attention.csv``, ``meta.json``; see
:mod:`gpu_simulate_test.core.profiling.bundle`) lands in
``<profiling_root>/<hardware>/<model>/``; the stage also records a run in
``<output.root>/vidur_profile/<run_id>/`` whose ``run_meta.json`` names the bundle.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pandas as pd
from rich.markup import escape

from gpu_simulate_test.config.vidur import VidurProfileStageConfig
from gpu_simulate_test.core.host.busy import (
    FOREIGN_CORES_LIMIT,
    ForeignLoad,
    busy_warning,
    wait_for_quiet,
)
from gpu_simulate_test.core.model.device import check_device, describe_device
from gpu_simulate_test.core.model.modeling import resolve_dtype
from gpu_simulate_test.core.profiling.bundle import (
    BUNDLE_SCHEMA_VERSION,
    MLP_OPS,
)
from gpu_simulate_test.core.profiling.grid import (
    ProfileGrid,
    Ranges,
    WorkloadExtent,
    build_grid,
    resolve_ranges,
)
from gpu_simulate_test.core.reporting import console, print_table, progress_bar
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.runs import default_run_id, start_run, utc_now
from gpu_simulate_test.vidur_profile.bundle_writer import (
    check_bundle_free,
    earlier_calibrations,
    earlier_serving_steps,
    write_bundle,
)
from gpu_simulate_test.vidur_profile.engine_calibration import calibrate_engine
from gpu_simulate_test.vidur_profile.layer_ops import (
    OP_DEFINITIONS,
    build_layer,
    check_attn_implementation,
)
from gpu_simulate_test.vidur_profile.profile_checks import disturbed, profile_warnings
from gpu_simulate_test.vidur_profile.profiler import ProfileTables, profile_tables
from gpu_simulate_test.vidur_profile.timing import TimingPolicy, timing_method

QK_NORM_NOTE = (
    "Qwen3's per-head q_norm/k_norm RMSNorm has no Vidur op: its time is folded into attn_rope"
)


SUMMARY_AXES: Mapping[str, tuple[str, str]] = MappingProxyType(
    {
        "prefill": ("num_q_tokens", "tokens"),
        "cached_prefill": ("context_tokens", "context tokens"),
    }
)
"""The summary's engine-step rows: which column each prompt phase's steps go by, and its name."""


def workload_extent(workload_dir: str | Path) -> WorkloadExtent:
    """The longest prompt and longest prompt + output of a workload run."""
    from gpu_simulate_test.core.traffic.workloads import load_workload

    loaded = load_workload(workload_dir)
    prompts = loaded.lengths["num_prefill_tokens"]
    totals = prompts + loaded.lengths["num_decode_tokens"]
    return WorkloadExtent(
        workload_id=loaded.workload_id,
        max_prompt_tokens=int(prompts.max()),
        max_total_tokens=int(totals.max()),
        path=str(loaded.path),
    )


def timing_policy(cfg: VidurProfileStageConfig) -> TimingPolicy:
    return TimingPolicy(
        warmup=cfg.profiling.warmup_iters,
        repeats=cfg.profiling.repeat_iters,
        min_repeats=min(cfg.profile.min_repeats, cfg.profiling.repeat_iters),
        budget_s=cfg.profile.shape_time_budget_s,
    )


REMEASURE_FACTOR = 3
"""A re-timed shape gets this many times the repeats, minimum repeats and time budget."""


def _keep_fastest(old: pd.DataFrame, new: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """``old`` with each op's stats taken from ``new`` where ``new`` (same ``keys``) has the
    lower median: another process only ever adds time, so the fastest clean look is the truest."""
    out = old.copy()
    rows = out[list(keys)].itertuples(index=False)
    index = {tuple(row): i for i, row in zip(out.index, rows, strict=True)}
    ops = sorted(
        {c[len("time_stats.") : -len(".median")] for c in new.columns if c.endswith(".median")}
    )
    for _, row in new.iterrows():
        i = index.get(tuple(row[k] for k in keys))
        if i is None:
            continue
        for op in ops:
            median = f"time_stats.{op}.median"
            if pd.notna(row[median]) and not (row[median] >= out.at[i, median]):
                for stat in ("min", "max", "mean", "median", "std"):
                    column = f"time_stats.{op}.{stat}"
                    if column in out.columns:
                        out.at[i, column] = row[column]
    return out


def _merge_fastest(tables: ProfileTables, again: ProfileTables) -> ProfileTables:
    return ProfileTables(
        mlp=_keep_fastest(tables.mlp, again.mlp, ["num_tokens"]),
        attention=_keep_fastest(
            tables.attention, again.attention, ["batch_size", "kv_cache_size", "prefill_chunk_size"]
        ),
    )


def retime_while_busy(
    layer: Any,
    grid: ProfileGrid,
    tables: ProfileTables,
    cfg: VidurProfileStageConfig,
    busy: float,
) -> tuple[ProfileTables, float]:
    """When other processes used the CPU while the profile was timed (``busy`` cores), time
    the whole grid again, up to ``profiling.remeasure_rounds`` times until a round is quiet,
    keeping each op's fastest look; returns the tables and the least busy round's load."""
    least = busy
    deadline = time.perf_counter() + cfg.profiling.busy_wait_s
    rounds = cfg.profiling.remeasure_rounds
    for k in range(1, rounds + 1):
        if least <= FOREIGN_CORES_LIMIT:
            break
        wait_s = max(0.0, deadline - time.perf_counter())
        if cfg.progress:
            console.print(
                f"other processes used {least:.2f} core(s) while the profile was timed (limit "
                f"{FOREIGN_CORES_LIMIT}): waiting up to {wait_s:.0f} s for a quiet machine, "
                f"then timing every shape again (round {k} of at most {rounds})"
            )
        wait_for_quiet(wait_s)
        load = ForeignLoad().start()
        with progress_bar(
            f"re-timing {cfg.model.name} (busy machine, round {k})", grid.num_shapes, cfg.progress
        ) as advance:
            again = profile_tables(layer, grid, cfg.block_size, timing_policy(cfg), advance)
        least = min(least, load.stop())
        tables = _merge_fastest(tables, again)
    return tables, least


def remeasure_disturbed(
    layer: Any,
    grid: ProfileGrid,
    tables: ProfileTables,
    cfg: VidurProfileStageConfig,
) -> tuple[ProfileTables, dict[str, Any]]:
    """Re-time the shapes the profile looks disturbed at (:func:`profile_checks.disturbed`),
    with ``REMEASURE_FACTOR`` times the repeats, keeping each op's fastest median, until no
    inversion is left or ``profiling.remeasure_rounds`` are spent. Returns the tables and what
    was done (rounds, shapes re-timed, findings before)."""
    policy = timing_policy(cfg)
    stronger = TimingPolicy(
        warmup=policy.warmup,
        repeats=policy.repeats * REMEASURE_FACTOR,
        min_repeats=policy.min_repeats * REMEASURE_FACTOR,
        budget_s=policy.budget_s * REMEASURE_FACTOR,
    )
    done: dict[str, Any] = {
        "rounds": 0,
        "shapes": 0,
        "findings_before": len(profile_warnings(tables.mlp, tables.attention, MLP_OPS)),
    }
    for k in range(1, cfg.profiling.remeasure_rounds + 1):
        tokens, decode, prefill = disturbed(tables.mlp, tables.attention, MLP_OPS)
        if not (tokens or decode or prefill):
            break
        sub = ProfileGrid(
            num_tokens=tuple(sorted(tokens)),
            batch_sizes=tuple(sorted({b for _, b in decode})),
            prefill_chunks=tuple(sorted({c for _, c in prefill})),
            kv_cache_sizes=tuple(sorted({kv for kv, _ in decode | prefill})),
        )
        with progress_bar(
            f"re-timing disturbed shapes (round {k})", sub.num_shapes, cfg.progress
        ) as advance:
            again = profile_tables(layer, sub, cfg.block_size, stronger, advance)
        tables = _merge_fastest(tables, again)
        done["rounds"] += 1
        done["shapes"] += sub.num_shapes
    return tables, done


def bundle_meta(
    cfg: VidurProfileStageConfig,
    device: str,
    dtype: Any,
    ranges: Ranges,
    grid: ProfileGrid,
    workload: WorkloadExtent | None,
    tables: ProfileTables,
    wall_time_s: float,
    run_id: str,
) -> dict[str, Any]:
    """Everything ``meta.json`` records: what was profiled, where, how, and what it covers."""
    import torch
    import transformers

    policy = timing_policy(cfg)
    return {
        "schema_version": BUNDLE_SCHEMA_VERSION,
        "model": dataclasses.asdict(cfg.model),
        "hardware": cfg.hardware.name,
        "hardware_config": dataclasses.asdict(cfg.hardware),
        "device": device,
        **describe_device(device),
        "dtype": dtype_name(dtype),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "attn_implementation": cfg.profiling.attn_implementation,
        "weights": "random (timing does not depend on weight values)",
        "timing_method": timing_method(device),
        "warmup_iters": policy.warmup,
        "repeat_iters": policy.repeats,
        "min_repeats": policy.min_repeats,
        "shape_time_budget_s": policy.budget_s,
        "ranges": {
            "max_num_tokens": max(grid.num_tokens),
            "max_batch_size": max(grid.batch_sizes),
            "max_prefill_chunk": max(grid.prefill_chunks),
            "max_kv_cache_size": max(grid.kv_cache_sizes),
            "block_size": cfg.block_size,
        },
        "requested_ranges": dataclasses.asdict(ranges),
        "grid": {
            "num_tokens": list(grid.num_tokens),
            "batch_sizes": list(grid.batch_sizes),
            "prefill_chunks": list(grid.prefill_chunks),
            "kv_cache_sizes": list(grid.kv_cache_sizes),
        },
        "workload": (
            {k: v for k, v in dataclasses.asdict(workload).items() if k != "path"}
            if workload
            else None
        ),
        "num_mlp_rows": len(tables.mlp),
        "num_attention_rows": len(tables.attention),
        "units": "milliseconds per layer",
        "op_definitions": dict(OP_DEFINITIONS),
        "notes": [QK_NORM_NOTE],
        "run_id": run_id,
        "created_at": utc_now(),
        "profile_wall_time_s": round(wall_time_s, 3),
    }


def dtype_name(dtype: Any) -> str:
    """``torch.bfloat16`` → ``bfloat16``, as ``meta.json`` records it."""
    return str(dtype).removeprefix("torch.")


def run(cfg: VidurProfileStageConfig, resolved_config: Mapping[str, Any]) -> Path:
    """Profile ``cfg.model`` on ``cfg.hardware`` into its bundle directory and return that path."""
    # every input check happens before the run directory is created
    device = check_device(cfg.hardware)
    check_attn_implementation(cfg.profiling.attn_implementation)
    if cfg.engine.enable:
        check_attn_implementation(cfg.engine.attn_implementation)
    workload = workload_extent(cfg.workload_dir) if cfg.workload_dir else None
    ranges = resolve_ranges(cfg.profile, cfg.model, device, workload)
    grid = build_grid(ranges)
    bundle = layout.bundle_dir(cfg.profiling_root, cfg.hardware.name, cfg.model.name)
    check_bundle_free(bundle, cfg.output.overwrite)
    run_id = cfg.output.run_id or default_run_id(resolved_config)

    with start_run(
        cfg.output.root, "vidur_profile", run_id, resolved_config, cfg.output.overwrite
    ) as r:
        r.update_meta(bundle_dir=str(bundle), device=device, num_shapes=grid.num_shapes)
        started = time.perf_counter()
        dtype = resolve_dtype(cfg.profiling.dtype, device)
        layer = build_layer(cfg.model, device, dtype, cfg.profiling.attn_implementation)
        with progress_bar(
            f"profiling {cfg.model.name} on {cfg.hardware.name}", grid.num_shapes, cfg.progress
        ) as advance:
            load = ForeignLoad().start()
            tables = profile_tables(layer, grid, cfg.block_size, timing_policy(cfg), advance)
            busy = load.stop()
        tables, busy = retime_while_busy(layer, grid, tables, cfg, busy)
        tables, remeasured = remeasure_disturbed(layer, grid, tables, cfg)
        remeasured["foreign_cores"] = round(busy, 3)
        del layer
        warnings = profile_warnings(tables.mlp, tables.attention, MLP_OPS)
        if (busy_profile := busy_warning("profile", busy)) is not None:
            warnings.append(busy_profile)
        steps, calibrations = earlier_calibrations(bundle, cfg, dtype_name(dtype))
        serving = earlier_serving_steps(bundle, cfg, calibrations)
        if cfg.engine.enable:
            rows, info, new_serving, busy_calibration = calibrate_engine(cfg, device, grid)
            if new_serving is not None:
                serving = (
                    new_serving
                    if serving is None
                    else pd.concat([serving, new_serving], ignore_index=True)
                )
            if busy_calibration is not None:
                warnings.append(busy_calibration)
            steps = rows if steps is None else pd.concat([steps, rows], ignore_index=True)
            calibrations[cfg.engine.backend.name] = info
        wall_time_s = time.perf_counter() - started
        meta = bundle_meta(cfg, device, dtype, ranges, grid, workload, tables, wall_time_s, run_id)
        meta["engine_calibration"] = calibrations
        meta["quality_warnings"] = warnings
        meta["remeasured"] = remeasured
        write_bundle(bundle, tables, meta, cfg.output.overwrite, steps, serving)
        r.update_meta(
            num_mlp_rows=len(tables.mlp),
            num_attention_rows=len(tables.attention),
            profile_wall_time_s=meta["profile_wall_time_s"],
            engine_calibration=sorted(calibrations),
            quality_warnings=len(warnings),
            remeasured=remeasured,
        )
    report_warnings(warnings, bundle, remeasured)
    if cfg.progress:
        print_summary(meta, tables, bundle, r.path, steps)
    return bundle


def report_warnings(
    warnings: Sequence[str],
    bundle: Path,
    remeasured: Mapping[str, Any] | None = None,
    shown: int = 5,
) -> None:
    """Say that the profile looks disturbed (``profile_checks``), with the worst cases."""
    again = remeasured or {}
    if again.get("rounds"):
        console.print(
            f"re-timed {again['shapes']} disturbed shape(s) in {again['rounds']} round(s): "
            f"{again['findings_before']} finding(s) before, {len(warnings)} after"
        )
    if not warnings:
        return
    console.print(
        f"[yellow]warning:[/] {len(warnings)} finding(s) in {escape(str(bundle))}: an op takes "
        "far longer on a smaller shape than on a larger one, even after re-timing; the machine "
        "was probably busy while they were timed. The pipeline will not reuse this bundle; "
        "re-profile on a quiet machine (output.overwrite=true) before trusting simulations. All "
        "of them are in meta.json quality_warnings:"
    )
    for line in warnings[:shown]:
        console.print(f"  {escape(line)}", soft_wrap=True)
    if len(warnings) > shown:
        console.print(f"  ... and {len(warnings) - shown} more")


def engine_summary_rows(engine_steps: pd.DataFrame) -> list[list[str]]:
    """Per backend and phase, the step time at the smallest and the largest size the
    calibration timed: a prompt's steps by its length (a cached prefill's by its context), else
    by batch. Only one-prompt rows (bursts apart), and decodes at their shortest context (the
    batch sweep), so that each end is the row its label names (the file's first and last rows
    were a longer context's batch of 4 and a burst's prompt of 102 tokens)."""
    rows = []
    for (backend, phase), group in engine_steps.groupby(["backend", "phase"]):
        size, axis = SUMMARY_AXES.get(str(phase), ("batch_size", "requests"))
        if "num_prompts" in group.columns and (group["num_prompts"] == 1).any():
            group = group[group["num_prompts"] == 1]
        if phase == "decode":
            group = group[group["context_tokens"] == group["context_tokens"].min()]
        group = group.sort_values([size, "context_tokens", "num_q_tokens"], kind="stable")
        first, last = group.iloc[0], group.iloc[-1]
        rows.append(
            [
                f"engine {backend} {phase} step",
                f"{first['step_ms']:.2f} ms at {int(first[size])} {axis}, "
                f"{last['step_ms']:.2f} ms at {int(last[size])}",
            ]
        )
    return rows


def print_summary(
    meta: Mapping[str, Any],
    tables: ProfileTables,
    bundle: Path,
    run_path: Path,
    engine_steps: pd.DataFrame | None = None,
) -> None:
    mlp = tables.mlp.sort_values("num_tokens")
    ranges = meta["ranges"]
    # the layer's per-token ops (emb runs once per model, not per layer)
    layer_cols = [f"time_stats.{op}.median" for op in MLP_OPS if op != "emb"]
    first, last = mlp.iloc[0], mlp.iloc[-1]
    rows = [
        ["device", f"{meta['device_name']} ({meta['dtype']}, {meta['timing_method']})"],
        ["mlp.csv rows", f"{len(tables.mlp)} (num_tokens 1..{ranges['max_num_tokens']})"],
        [
            "attention.csv rows",
            f"{len(tables.attention)} (batch ≤ {ranges['max_batch_size']}, chunk ≤ "
            f"{ranges['max_prefill_chunk']}, kv ≤ {ranges['max_kv_cache_size']})",
        ],
        [
            "per-token ops, 1 layer",
            f"{first[layer_cols].sum():.3f} ms at {int(first['num_tokens'])} tokens, "
            f"{last[layer_cols].sum():.3f} ms at {int(last['num_tokens'])}",
        ],
        ["wall time", f"{meta['profile_wall_time_s']:.1f} s"],
    ]
    if engine_steps is not None:
        rows += engine_summary_rows(engine_steps)
    print_table(f"vidur profile {meta['model']['name']} on {meta['hardware']}", ["", ""], rows)
    console.print(f"[bold]bundle:[/] {bundle}")
    console.print(f"[bold]run:[/] {run_path}")
