"""The top-k kernels of an nsys kernel summary, as ``top_kernels.yaml`` for a later ncu pass.

CLI: ``python -m gpu_simulate_test.deep_profile.nsight.top_kernels <cuda_gpu_kern_sum.csv> -k 5
-o top_kernels.yaml``.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from gpu_simulate_test.deep_profile.nsight.parsers import KernelRecord, parse_kernel_summary
from gpu_simulate_test.io.artifacts import atomic_open

TOP_KERNELS_FILE = "top_kernels.yaml"
TOP_KERNELS_VERSION = "1"


def extract_top_kernels(records: Sequence[KernelRecord], k: int) -> list[KernelRecord]:
    """The ``k`` kernels with the most total GPU time (ties: more calls, then name)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    ranked = sorted(records, key=lambda r: (-r.total_ms, -r.calls, r.kernel_name))
    return ranked[:k]


KERNEL_NAME_BASE = "demangled"
"""What ``ncu --kernel-name`` must match :func:`kernel_name_regex` against
(``--kernel-name-base demangled``): nsys reports demangled names, while ncu's default base is the
bare function name (``gemvx`` of ``void gemvx::kernel<...>(...)``), which such a regex never
matches."""


def _without_parameters(name: str) -> str:
    """``name`` without its trailing parameter list: ``void k<int>(T1, T2)`` -> ``void k<int>``."""
    if not name.endswith(")"):
        return name
    depth = 0
    for i in range(len(name) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(name[i], 0)
        if depth == 0:
            return name[:i].rstrip()
    return name


def kernel_name_regex(name: str) -> str:
    """An anchored regex for the demangled kernel ``name`` as nsys reports it, for ``ncu
    --kernel-name-base demangled --kernel-name regex:``: the name up to its parameter list, then
    any parameter list or none, so a tool that spells the parameters differently still matches
    while another template instantiation does not."""
    return rf"^{re.escape(_without_parameters(name))}(\(.*\))?$"


def top_kernels_document(records: Sequence[KernelRecord], source: str = "") -> dict[str, Any]:
    """The YAML document: schema version, source file, and one entry per kernel with its rank."""
    total_ms = sum(r.total_ms for r in records)
    return {
        "schema_version": TOP_KERNELS_VERSION,
        "source": source,
        "kernels": [
            {
                "rank": rank,
                "name": r.kernel_name,
                "regex": kernel_name_regex(r.kernel_name),
                "total_ms": r.total_ms,
                "calls": r.calls,
                "mean_ms": r.mean_ms,
                "share_pct": r.share_pct,
            }
            for rank, r in enumerate(records, start=1)
        ],
        "listed_total_ms": total_ms,
    }


def write_top_kernels_yaml(
    records: Sequence[KernelRecord], path: str | Path, source: str = ""
) -> Path:
    """Write :func:`top_kernels_document` to ``path`` atomically (parent directory must exist)."""
    out = Path(path)
    text = yaml.safe_dump(
        top_kernels_document(records, source), sort_keys=False, allow_unicode=True, width=1000
    )
    with atomic_open(out) as handle:
        handle.write(text)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpu_simulate_test.deep_profile.nsight.top_kernels",
        description="Top-k kernels by total GPU time from an nsys cuda_gpu_kern_sum CSV.",
    )
    parser.add_argument("csv", type=Path, help="nsys stats --report cuda_gpu_kern_sum CSV")
    parser.add_argument("-k", type=int, default=5, help="how many kernels (default 5)")
    parser.add_argument("-o", "--output", type=Path, default=Path(TOP_KERNELS_FILE))
    args = parser.parse_args(argv)
    if args.k < 1:
        parser.error(f"-k must be >= 1, got {args.k}")
    if not args.output.parent.is_dir():
        parser.error(f"-o {args.output}: directory {args.output.parent} does not exist")
    try:
        top = extract_top_kernels(parse_kernel_summary(args.csv), args.k)
        path = write_top_kernels_yaml(top, args.output, source=str(args.csv))
    except (ValueError, OSError) as exc:  # NsightParseError is a ValueError: it names the file
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {len(top)} kernels to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
