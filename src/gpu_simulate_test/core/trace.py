"""Import a real trace CSV (Vidur's processed-trace format) with clear errors on bad rows."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpu_simulate_test.io.artifacts import ArtifactError, read_csv_text, validate_frame
from gpu_simulate_test.io.schemas import TRACE_IMPORT, TRACE_IMPORT_ARRIVED_AT

TRACE_IMPORT_TIMED = dataclasses.replace(
    TRACE_IMPORT,
    name="trace_import_timed",
    columns=(TRACE_IMPORT_ARRIVED_AT, *TRACE_IMPORT.columns),
    sorted_by=TRACE_IMPORT_ARRIVED_AT.name,
)
TRACE_EXPECTED = "a trace CSV (num_prefill_tokens, num_decode_tokens, optional arrived_at)"
"""What a trace file should be, for error messages."""


@dataclass(frozen=True)
class ImportedTrace:
    """Lengths (and arrivals, when the trace has them) of the requests taken from a trace."""

    num_prefill_tokens: np.ndarray
    num_decode_tokens: np.ndarray
    arrived_at_s: np.ndarray | None
    total_rows: int
    clipped_rows: int


def load_trace(
    path: Path | str,
    max_requests: int,
    max_context: int,
    clip_to_max_context: bool,
) -> ImportedTrace:
    """Read ``path``, take the first ``max_requests`` rows (0: all) and check every length.

    Lengths whose sum exceeds ``max_context`` fail (naming the row) unless clipping is on, in
    which case the prompt is shortened first, then the output.
    """
    p = Path(path)
    if not p.is_file():
        raise ArtifactError(f"workload.trace_file={p}: file does not exist")
    frame = read_csv_text(p, TRACE_EXPECTED)
    total_rows = len(frame)
    if total_rows == 0:
        raise ArtifactError(f"{p}: trace has a header but no rows")
    if max_requests:
        frame = frame.head(max_requests)
    timed = TRACE_IMPORT_ARRIVED_AT.name in frame.columns
    checked = validate_frame(frame, TRACE_IMPORT_TIMED if timed else TRACE_IMPORT, where=str(p))
    prefill = checked["num_prefill_tokens"].to_numpy(dtype=np.int64).copy()
    decode = checked["num_decode_tokens"].to_numpy(dtype=np.int64).copy()
    too_long = np.flatnonzero(prefill + decode > max_context)
    if too_long.size and not clip_to_max_context:
        row = int(too_long[0])
        raise ArtifactError(
            f"{p}: row {row + 1}: num_prefill_tokens + num_decode_tokens = "
            f"{prefill[row] + decode[row]} exceeds the model's max context {max_context} "
            f"({too_long.size} such row(s)); pass workload.clip_to_max_context=true to clip"
        )
    if too_long.size:
        decode = np.minimum(decode, max_context - 1)
        prefill = np.minimum(prefill, max_context - decode)
    arrived = checked["arrived_at"].to_numpy(dtype=float) if timed else None
    return ImportedTrace(prefill, decode, arrived, total_rows, int(too_long.size))
