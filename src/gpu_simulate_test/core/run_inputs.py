"""Read the two runs a comparison needs through the contract layer, and describe their setup."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import ArtifactError, read_csv
from gpu_simulate_test.io.runs import open_upstream_run
from gpu_simulate_test.io.schemas import REQUEST_METRICS, TOKEN_METRICS


@dataclass(frozen=True)
class RunInput:
    """One upstream run: its directory, ``run_meta.json`` and request table."""

    path: Path
    meta: dict[str, Any]
    requests: pd.DataFrame

    @property
    def workload_id(self) -> str:
        return str(self.meta.get("workload_id"))


def load_run(path: Path | str, stage: str) -> RunInput:
    """A complete run of ``stage`` with a workload id and a valid ``request_metrics.csv``."""
    p = Path(path)
    meta = open_upstream_run(p, stage)
    if not meta.get("workload_id"):
        raise ArtifactError(f"{p / layout.RUN_META}: no workload_id recorded")
    table = p / layout.REQUEST_METRICS
    frame = read_csv(table, REQUEST_METRICS)
    expected = meta.get("num_requests")
    if isinstance(expected, int) and len(frame) != expected:
        raise ArtifactError(
            f"{table}: {len(frame)} rows, but {layout.RUN_META} says the run had {expected} "
            "requests (a truncated or edited file?)"
        )
    ok = frame["status"] == "ok"
    for column in ("ttft_s", "e2e_s"):
        missing = ok & frame[column].isna()
        if missing.any():
            row = int(missing.to_numpy().nonzero()[0][0])
            raise ArtifactError(
                f"{table}: row {row + 1}, column {column!r}: empty, but the request's status "
                "is ok (a finished request has a first and a last token)"
            )
    return RunInput(p, meta, frame)


def real_itls_s(run: RunInput, request_ids: np.ndarray) -> np.ndarray:
    """Pooled inter-token gaps of the given requests (empty when the run has no token table)."""
    path = run.path / layout.TOKEN_METRICS
    if not path.is_file():
        return np.array([])
    tokens = read_csv(path, TOKEN_METRICS)
    keep = tokens["request_id"].isin(request_ids)
    return tokens.loc[keep, "itl_s"].dropna().to_numpy(dtype=float)


def check_same_workload(real: RunInput, sim: RunInput) -> None:
    """Fail unless both runs replayed the same workload (by its stable id) and model."""
    did = "simulated" if sim.meta.get("stage") == "vidur_simulate" else "replayed"
    if real.workload_id != sim.workload_id:
        raise ArtifactError(
            f"different workloads: {real.path} replayed {real.workload_id}, "
            f"{sim.path} {did} {sim.workload_id}; compare runs of one workload"
        )
    real_model = _get(real.meta, "config", "model", "name")
    sim_model = _get(sim.meta, "config", "model", "name")
    if real_model and sim_model and real_model != sim_model:
        ran = "simulated" if did == "simulated" else "ran"
        raise ArtifactError(
            f"different models: {real.path} ran {real_model}, {sim.path} {ran} {sim_model}"
        )


def _get(meta: Mapping[str, Any], *keys: str) -> Any:
    node: Any = meta
    for key in keys:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


def setup(real: RunInput, sim: RunInput) -> dict[str, Any]:
    """The setup of both sides, as recorded in their ``run_meta.json`` files."""
    gpus = _get(real.meta, "host", "gpus") or []
    backend_cfg = _get(real.meta, "config", "backend") or {}
    knobs = _get(real.meta, "backend", "requested") or {
        k: v for k, v in backend_cfg.items() if k not in ("server", "base_url")
    }
    return {
        "workload_id": real.workload_id,
        "real": {
            "run_dir": str(real.path),
            "model": _get(real.meta, "config", "model", "name"),
            "hf_name": _get(real.meta, "config", "model", "hf_name"),
            "hardware": _get(real.meta, "config", "hardware", "name"),
            "device": _get(real.meta, "backend", "device"),
            "device_name": gpus[0]["name"] if gpus else _get(real.meta, "host", "cpu"),
            "dtype": str(_get(real.meta, "backend", "dtype") or "").removeprefix("torch."),
            "attn_implementation": _get(real.meta, "backend", "attn_implementation"),
            "backend": _get(real.meta, "backend", "name") or backend_cfg.get("name"),
            "imported": bool(_get(real.meta, "backend", "imported")),
            "backend_knobs": knobs,
            "request_statuses": _get(real.meta, "request_statuses"),
            "transformers": _get(real.meta, "packages", "transformers"),
            "torch": _get(real.meta, "packages", "torch"),
        },
        "sim": {
            "run_dir": str(sim.path),
            "model": _get(sim.meta, "config", "model", "name"),
            "hardware": _get(sim.meta, "config", "hardware", "name"),
            "vidur_device": _get(sim.meta, "vidur_device", "device"),
            "dtype": _get(sim.meta, "bundle_dtype"),
            "scheduler": _get(sim.meta, "scheduler"),
            "num_blocks": _get(sim.meta, "num_blocks"),
            "bundle": _get(sim.meta, "bundle_path"),
            "predictor_fingerprint": _get(sim.meta, "predictor_fingerprint"),
            "vidur_version": _get(sim.meta, "vidur_version"),
        },
    }
