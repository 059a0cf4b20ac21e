"""The Vidur profiling bundle: ``mlp.csv``, ``attention.csv`` and ``meta.json`` in Vidur's formats.

Layout: ``<profiling_root>/<hardware>/<model>/``. Column names are Vidur's own (``n_head``,
``time_stats.<op>.<stat>``, times in milliseconds per layer), kept exactly at this boundary.
Written by the ``vidur_profile`` stage, read by ``vidur_simulate``; every load checks the tables
against their schemas, the grid ``meta.json`` records and the timing check of
:mod:`.bundle_checks`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pandas as pd

from gpu_simulate_test.config.schema import MODEL_DIMENSIONS, ModelConfig
from gpu_simulate_test.core.profiling.bundle_checks import profile_warnings
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import ArtifactError, Column, TableSchema, read_csv, read_json
from gpu_simulate_test.io.schemas import ENGINE_SCHEDULE

BUNDLE_SCHEMA_VERSION = "1.0"
STATS: tuple[str, ...] = ("min", "max", "mean", "median", "std")
MLP_OPS: tuple[str, ...] = (
    "emb",
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)
"""Per-token ops, in the order of Vidur's own mlp.csv. Qwen3's per-head q/k RMSNorm is folded
into ``attn_rope`` (Vidur has no op for it). ``emb`` is written for completeness; Vidur's
predictor does not read it."""


def _stat_columns(op: str, stats: tuple[str, ...], nullable: bool = False) -> tuple[Column, ...]:
    return tuple(
        Column(f"time_stats.{op}.{stat}", "float", "ms", f"{stat} of {op}", nullable, min_value=0)
        for stat in stats
    )


MLP_TABLE = TableSchema(
    name="vidur_mlp",
    version=BUNDLE_SCHEMA_VERSION,
    description="Vidur compute profile of the per-token ops of one decoder layer (ms per layer).",
    columns=(
        *(col for op in MLP_OPS for col in _stat_columns(op, STATS)),
        Column("n_head", "int", "", "query heads", min_value=1),
        Column("n_kv_head", "int", "", "key/value heads", min_value=1),
        Column("n_embd", "int", "", "hidden size", min_value=1),
        Column("n_expanded_embd", "int", "", "MLP intermediate size", min_value=1),
        Column("vocab_size", "int", "", "vocabulary size", min_value=1),
        Column("use_gated_mlp", "bool", "", "SwiGLU (gate and up projections)"),
        Column("num_tokens", "int", "tokens", "tokens in the batch", min_value=1),
        Column("num_tensor_parallel_workers", "int", "", "tensor-parallel degree", min_value=1),
    ),
)

ATTENTION_TABLE = TableSchema(
    name="vidur_attention",
    version=BUNDLE_SCHEMA_VERSION,
    description=(
        "Vidur attention profile (ms per layer). prefill_chunk_size == 0: a decode batch of "
        "batch_size requests with kv_cache_size context each; otherwise one prefill chunk after "
        "kv_cache_size tokens."
    ),
    columns=(
        Column("n_embd", "int", "", "hidden size", min_value=1),
        Column("n_q_head", "int", "", "query heads", min_value=1),
        Column("n_kv_head", "int", "", "key/value heads", min_value=1),
        Column("block_size", "int", "tokens", "KV-cache block size", min_value=1),
        Column("num_tensor_parallel_workers", "int", "", "tensor-parallel degree", min_value=1),
        Column("batch_size", "int", "", "requests in the batch", min_value=1),
        Column("kv_cache_size", "int", "tokens", "tokens already in the KV cache", min_value=0),
        Column("prefill_chunk_size", "int", "tokens", "prefill chunk (0: decode)", min_value=0),
        *_stat_columns("attn_prefill", ("median",), nullable=True),
        *_stat_columns("attn_decode", ("median",), nullable=True),
        *_stat_columns("attn", ("median",)),
        *_stat_columns("attn_kv_cache_save", ("median",)),
    ),
)

ENGINE_PHASES: tuple[str, ...] = ("prefill", "decode", "mixed", "cached_prefill")
IDLE_PREFILL_PHASES: tuple[str, ...] = ("prefill", "cached_prefill")
"""The phases whose row is one prompt's step alone on an idle engine."""
ENGINE_STEPS_TABLE = TableSchema(
    name="engine_steps",
    version=BUNDLE_SCHEMA_VERSION,
    description=(
        "Whole engine steps timed through the real bench's backend (not a Vidur file): a prefill "
        "row is one request's prompt in one step on an idle engine (time from arrival to its "
        "first token), a decode row is batch_size requests decoding together (median "
        "inter-token time), a mixed row is one prompt of num_q_tokens prefilled next to "
        "batch_size - 1 decodes with context_tokens each (the decoders' gap around it), a "
        "cached_prefill row is a prefill row whose prompt's first context_tokens - num_q_tokens "
        "tokens were already in the prefix cache (only num_q_tokens computed); a row with "
        "num_prompts k > 1 is read off a burst: k prompts in the one step (a mixed row's next "
        "to batch_size - k decodes; calibration version 11 on)."
    ),
    columns=(
        Column("backend", "str", "", "real-bench backend (hf_cb, hf_generate, ...)"),
        Column("phase", "str", "", "prefill, decode, mixed or cached_prefill"),
        Column("batch_size", "int", "", "requests in the step", min_value=1),
        Column(
            "num_q_tokens",
            "int",
            "tokens",
            "query tokens per request (mixed: the prompt)",
            min_value=1,
        ),
        Column(
            "context_tokens",
            "int",
            "tokens",
            "KV tokens per request, this step's included (mixed: of the decoders)",
            min_value=1,
        ),
        Column("step_ms", "float", "ms", "median wall time of the step", min_value=0),
        Column("samples", "int", "", "timed steps behind the median", min_value=1),
    ),
    optional=(
        Column(
            "num_prompts",
            "int",
            "",
            "prompts of num_q_tokens each in the step (a burst's: prefill, k prompts alone; "
            "mixed, k prompts next to batch_size - k decodes); absent or empty: 1, or "
            "batch_size for a prefill",
            min_value=1,
            nullable=True,
        ),
    ),
)

SERVING_STEPS_TABLE = TableSchema(
    name="serving_steps",
    version=BUNDLE_SCHEMA_VERSION,
    description=(
        "The engine's own steps during the calibration replays under load (Poisson workloads "
        "at a few rates, seeded apart from judged workloads; calibration/serving_replay.py): "
        "the engine_schedule table of a vLLM server that records its steps, per replay, with "
        "the backend and the replay's rate. vidur_simulate fits what serving adds to a step's "
        "time on them (calibration/serving_load.py)."
    ),
    columns=(
        Column("backend", "str", "", "real-bench backend (vllm)"),
        Column("rate_qps", "float", "req/s", "the replay's arrival rate", min_value=0),
        Column(
            "replay",
            "int",
            "",
            "which replay, in the order they ran (rounds of rates)",
            min_value=0,
        ),
        *ENGINE_SCHEDULE.columns,
    ),
    optional=(
        Column(
            "client_sends",
            "int",
            "requests",
            "requests the client sent while the step ran (calibration version 12 on; the API "
            "server's intake shares the engine's cores; empty: not recorded)",
            nullable=True,
            min_value=0,
        ),
        Column(
            "client_send_offsets_ms",
            "str",
            "ms",
            "how far into the step each of those sends fell, ';'-separated (calibration version "
            "17 on: a send in the step's first part adds nothing to it; empty: none)",
            nullable=True,
        ),
    ),
)

META_REQUIRED_KEYS: tuple[str, ...] = (
    "schema_version",
    "model",
    "hardware",
    "dtype",
    "device_name",
    "torch_version",
    "attn_implementation",
    "timing_method",
    "ranges",
    "created_at",
)
"""``meta.json`` keys. ``model`` holds the architecture numbers (the ModelConfig fields);
``ranges`` holds ``max_num_tokens``, ``max_batch_size``, ``max_prefill_chunk``,
``max_kv_cache_size`` and ``block_size`` actually covered."""

MODEL_DIM_FIELDS: tuple[str, ...] = MODEL_DIMENSIONS
"""What must match between a bundle's ``meta.json`` ``model`` and the model simulated."""


@dataclass(frozen=True)
class BundleRanges:
    """What a bundle covers (from its meta.json)."""

    max_num_tokens: int
    max_batch_size: int
    max_prefill_chunk: int
    max_kv_cache_size: int
    block_size: int


@dataclass(frozen=True)
class Bundle:
    path: Path
    mlp: pd.DataFrame
    attention: pd.DataFrame
    meta: dict[str, Any]
    ranges: BundleRanges

    @property
    def mlp_path(self) -> Path:
        return self.path / layout.MLP_PROFILE

    @property
    def attention_path(self) -> Path:
        return self.path / layout.ATTENTION_PROFILE

    @property
    def engine_steps_path(self) -> Path:
        return self.path / layout.ENGINE_STEPS

    def engine_calibration(self, backend: str) -> dict[str, Any] | None:
        """How ``backend`` was calibrated (meta.json ``engine_calibration``), or None."""
        found = self.meta.get("engine_calibration", {}).get(backend)
        return found if isinstance(found, dict) else None

    def engine_steps(self, backend: str) -> pd.DataFrame:
        """The calibration rows of ``backend``; ArtifactError when the bundle has none."""
        path = self.engine_steps_path
        if not path.is_file() or self.engine_calibration(backend) is None:
            raise ArtifactError(
                f"{self.path}: no engine calibration for backend {backend!r} (profile again with "
                f"engine.enable=true engine.backend.name={backend}, or set "
                "vidur.engine_overhead=none)"
            )
        table = read_csv(path, ENGINE_STEPS_TABLE)
        rows = table[table["backend"] == backend]
        if rows.empty:
            raise ArtifactError(f"{path}: no rows for backend {backend!r}")
        bad = sorted(set(rows["phase"]) - set(ENGINE_PHASES))
        if bad:
            raise ArtifactError(
                f"{path}: column 'phase' has {bad}, expected one of {', '.join(ENGINE_PHASES)}"
            )
        return rows.reset_index(drop=True)

    def serving_steps(self, backend: str) -> pd.DataFrame | None:
        """The calibration replays' steps of ``backend`` (None: the bundle has none)."""
        path = self.path / layout.SERVING_STEPS
        if not path.is_file():
            return None
        table = read_csv(path, SERVING_STEPS_TABLE)
        rows = table[table["backend"] == backend]
        return rows.reset_index(drop=True) if len(rows) else None


def check_model_matches(meta: dict[str, Any], model: ModelConfig, where: str) -> None:
    """Fail naming every dimension where the bundle's model differs from ``model``."""
    recorded = meta.get("model", {})
    diffs = [
        f"{name}: bundle {recorded.get(name)!r}, model {getattr(model, name)!r}"
        for name in MODEL_DIM_FIELDS
        if recorded.get(name) != getattr(model, name)
    ]
    if diffs:
        raise ArtifactError(
            f"{where}: bundle was profiled for a different model than model={model.name} ("
            + "; ".join(diffs)
            + ")"
        )


def _missing(
    where: Path, table: pd.DataFrame, columns: Sequence[str], expected: set[tuple[int, ...]]
) -> None:
    have = {tuple(int(v) for v in row) for row in table[list(columns)].itertuples(index=False)}
    absent = sorted(expected - have)
    if absent:
        first = ", ".join(f"{c}={v}" for c, v in zip(columns, absent[0], strict=True))
        raise ArtifactError(
            f"{where}: no row for {first}"
            + (f" (and {len(absent) - 1} more)" if len(absent) > 1 else "")
            + f", which the profile's grid in {layout.BUNDLE_META} lists: a row was removed? "
            "Profile again (vidur_profile output.overwrite=true)"
        )
    extra = len(table) - len(have)
    if extra:
        raise ArtifactError(f"{where}: {extra} duplicate row(s) of the same {', '.join(columns)}")


def check_grid_rows(
    path: Path, meta: Mapping[str, Any], mlp: pd.DataFrame, attention: pd.DataFrame
) -> None:
    """Every shape of the grid ``meta.json`` records has its row, once (a bundle from before the
    grid was recorded is not checked)."""
    grid = meta.get("grid")
    if not isinstance(grid, Mapping):
        return
    from gpu_simulate_test.core.profiling.grid import ProfileGrid  # the profiler's own shapes

    try:
        shapes = ProfileGrid(
            **{
                name: tuple(int(v) for v in grid[name])
                for name in ("num_tokens", "batch_sizes", "prefill_chunks", "kv_cache_sizes")
            }
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(f"{path / layout.BUNDLE_META}: bad 'grid' ({exc})") from exc
    _missing(path / layout.MLP_PROFILE, mlp, ["num_tokens"], {(t,) for t in shapes.num_tokens})
    _missing(
        path / layout.ATTENTION_PROFILE,
        attention,
        ["batch_size", "kv_cache_size", "prefill_chunk_size"],
        {(b, kv, 0) for b, kv in shapes.decode_shapes}
        | {(1, kv, c) for c, kv in shapes.prefill_shapes},
    )


SHOWN_FINDINGS = 3
"""Timing findings quoted in the error of a bundle refused for them (all are counted)."""


def check_timings(
    path: Path, meta: Mapping[str, Any], mlp: pd.DataFrame, attention: pd.DataFrame
) -> None:
    """Refuse a bundle whose tables show a timing finding (:func:`.bundle_checks.profile_warnings`:
    an op far slower on a smaller shape) that its ``meta.json`` ``quality_warnings`` does not
    record. The profiler records every finding it leaves in a fresh profile (a disturbed profile
    the pipeline re-profiles or, with ``accept_profile_warnings``, simulates); one it did not
    record was made after it checked: a table edited or damaged since, or a bundle from before
    the check. The error names the file, the op and the row."""
    recorded = meta.get("quality_warnings")
    known = set(recorded) if isinstance(recorded, list) else set()
    found = [line for line in profile_warnings(mlp, attention, MLP_OPS) if line not in known]
    if not found:
        return
    more = len(found) - SHOWN_FINDINGS
    raise ArtifactError(
        f"{path}: {len(found)} timing finding(s) that {layout.BUNDLE_META} quality_warnings does "
        "not record (an op far slower on a smaller shape; the tables changed after profiling?): "
        + "; ".join(f"{path}/{line}" for line in found[:SHOWN_FINDINGS])
        + (f" (and {more} more)" if more > 0 else "")
        + "; profile again (vidur_profile output.overwrite=true)"
    )


META_OBJECT_KEYS: tuple[str, ...] = ("model", "ranges", "engine_calibration")
"""``meta.json`` keys whose value is a JSON object (``engine_calibration`` where present)."""
JSON_KINDS: Mapping[type, str] = MappingProxyType(
    {str: "a string", list: "an array", int: "a number", float: "a number", bool: "a boolean"}
)


def check_meta_objects(where: Path, meta: Mapping[str, Any]) -> None:
    """Refuse a ``meta.json`` whose ``model``, ``ranges`` or ``engine_calibration`` is not a JSON
    object, naming the file and the key (read as one, it failed with a bare AttributeError)."""
    for key in META_OBJECT_KEYS:
        value = meta.get(key, {})
        if not isinstance(value, Mapping):
            kind = JSON_KINDS.get(type(value), type(value).__name__)
            raise ArtifactError(
                f"{where}: '{key}' is {kind}, expected a JSON object "
                "(profile again: vidur_profile output.overwrite=true)"
            )


def load_bundle(
    path: Path | str, model: ModelConfig | None = None, *, timings_checked: bool = True
) -> Bundle:
    """Read and validate a bundle directory; with ``model``, also check the dimensions match.

    ``timings_checked`` false skips :func:`check_timings`, for a reader that only wants what the
    bundle covers or holds besides its timings (the ranges and calibrations of a bundle about to
    be profiled again)."""
    p = Path(path)
    if not p.is_dir():
        raise ArtifactError(
            f"{p}: no profiling bundle there (run vidur_profile with this model and hardware, "
            "or point profiling_root= at the bundles)"
        )
    meta = read_json(p / layout.BUNDLE_META, required_keys=META_REQUIRED_KEYS)
    check_meta_objects(p / layout.BUNDLE_META, meta)
    mlp = read_csv(p / layout.MLP_PROFILE, MLP_TABLE)
    attention = read_csv(p / layout.ATTENTION_PROFILE, ATTENTION_TABLE)
    if model is not None:
        check_model_matches(meta, model, str(p / layout.BUNDLE_META))
    check_grid_rows(p, meta, mlp, attention)
    if timings_checked:
        check_timings(p, meta, mlp, attention)
    try:
        ranges = BundleRanges(
            **{k: int(meta["ranges"][k]) for k in BundleRanges.__dataclass_fields__}
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(f"{p / layout.BUNDLE_META}: bad or missing 'ranges' ({exc})") from exc
    return Bundle(p, mlp, attention, meta, ranges)
