"""What a client's router read of each server when it routed each request
(:data:`~gpu_simulate_test.io.schemas.ROUTER_READS`): written by the real fleet, read by an
oracle replay so that its simulated router decides on the same inputs as the client did
(exact first: the same code on the same reads must send every request to the same replica;
only then is the replay's own timing judged)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import ArtifactError, read_csv, write_csv
from gpu_simulate_test.io.schemas import ROUTER_READS

READ_BY_CLIENT = "the real client's"
"""An oracle replay's ``router_reads`` (``run_meta.json``'s ``oracle``) when its router read
the client's recorded reads."""
Loads = list[tuple[int, float]]
"""Per server, (waiting requests, KV usage in [0, 1])."""


@dataclass(frozen=True)
class RouterRead:
    """One routing decision: when (run clock), where to, on what load."""

    routed_s: float
    engine: int
    loads: Loads


@dataclass(frozen=True)
class RecordedReads:
    """A run's routing decisions, per request of the asked ids (in that order; NaN and None
    where the router did not route it)."""

    routed_s: np.ndarray
    loads: list[Loads | None]


def write_router_reads(run_dir: Path, reads: Mapping[int, RouterRead]) -> None:
    """``reads``: per request id, the router's decision."""
    rows = [
        (
            rid,
            read.routed_s,
            read.engine,
            " ".join(str(w) for w, _ in read.loads),
            " ".join(repr(float(u)) for _, u in read.loads),  # repr: the float back exactly
        )
        for rid, read in sorted(reads.items())
    ]
    frame = pd.DataFrame(rows, columns=ROUTER_READS.column_names)
    write_csv(run_dir / layout.ROUTER_READS, frame, ROUTER_READS)


def read_router_reads(run_dir: Path, ids: Sequence[int] | np.ndarray) -> RecordedReads | None:
    """The run's routing decisions for the requests ``ids``; None when the run recorded none (a
    router that reads no load)."""
    path = run_dir / layout.ROUTER_READS
    if not path.is_file():
        return None
    frame = read_csv(path, ROUTER_READS)
    by_id: dict[int, Loads] = {}
    when = dict(
        zip(frame["request_id"].astype(int), frame["routed_time_s"].astype(float), strict=True)
    )
    for rid, waiting, usage in zip(
        frame["request_id"], frame["num_waiting"], frame["kv_cache_usage"], strict=True
    ):
        counts, levels = str(waiting).split(), str(usage).split()
        if len(counts) != len(levels) or not counts:
            raise ArtifactError(
                f"{path}: request {rid} has {len(counts)} num_waiting and {len(levels)} "
                "kv_cache_usage values; expected one of each per server"
            )
        try:
            by_id[int(rid)] = [(int(w), float(u)) for w, u in zip(counts, levels, strict=True)]
        except ValueError as err:
            raise ArtifactError(
                f"{path}: request {rid}: num_waiting must be integers and kv_cache_usage "
                f"numbers, space-separated ({err})"
            ) from err
    return RecordedReads(
        np.array([when.get(int(rid), np.nan) for rid in ids], dtype=float),
        [by_id.get(int(rid)) for rid in ids],
    )
