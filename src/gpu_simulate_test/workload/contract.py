"""What the workload stage writes into ``tmp/workload/<run_id>/``.

Every later stage reads these, so the names and tables are declared in the shared contract
(:mod:`gpu_simulate_test.io.layout`, :mod:`gpu_simulate_test.io.schemas`); this is their list.
"""

from __future__ import annotations

from gpu_simulate_test.core.traffic.workloads import WORKLOAD_META_VERSION
from gpu_simulate_test.io import layout, schemas

PROMPTS_JSONL = layout.PROMPTS
TRACE_LENGTHS_CSV = layout.TRACE_LENGTHS
TRACE_INTERVALS_CSV = layout.TRACE_INTERVALS
WORKLOAD_META_JSON = layout.WORKLOAD_META
FILES: tuple[str, ...] = (PROMPTS_JSONL, TRACE_LENGTHS_CSV, TRACE_INTERVALS_CSV, WORKLOAD_META_JSON)

TRACE_LENGTHS_TABLE = schemas.TRACE_LENGTHS
TRACE_INTERVALS_TABLE = schemas.TRACE_INTERVALS
TRACE_IMPORT_TABLE = schemas.TRACE_IMPORT
"""What a real trace file must hold to be imported (``workload=trace``)."""
PROMPT_RECORD_KEYS = schemas.PROMPT_RECORD_KEYS

__all__ = (
    "FILES",
    "PROMPTS_JSONL",
    "PROMPT_RECORD_KEYS",
    "TRACE_IMPORT_TABLE",
    "TRACE_INTERVALS_CSV",
    "TRACE_INTERVALS_TABLE",
    "TRACE_LENGTHS_CSV",
    "TRACE_LENGTHS_TABLE",
    "WORKLOAD_META_JSON",
    "WORKLOAD_META_VERSION",
)
