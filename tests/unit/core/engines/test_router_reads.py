"""What the client's router read, per request: written and read back exactly (the floats too,
so an oracle replay's router scores them as the client did), and a malformed row refused with
the file and the request named."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from gpu_simulate_test.core.engines.router_reads import (
    RouterRead,
    read_router_reads,
    write_router_reads,
)
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import ArtifactError


def test_reads_come_back_exactly_in_the_asked_order(tmp_path: Path) -> None:
    reads = {
        3: RouterRead(0.25, 1, [(2, 0.1 + 0.2), (0, 1 / 3)]),
        1: RouterRead(0.125, 0, [(0, 0.0), (5, 0.0625)]),
    }
    write_router_reads(tmp_path, reads)
    back = read_router_reads(tmp_path, [1, 2, 3])
    assert back is not None
    assert back.loads == [reads[1].loads, None, reads[3].loads]
    assert back.routed_s[0] == 0.125 and math.isnan(back.routed_s[1])
    third = back.loads[2]
    assert third is not None and third[0][1] == 0.1 + 0.2  # not 0.3: repr round-trips


def test_no_file_is_no_reads_and_a_malformed_row_names_the_file(tmp_path: Path) -> None:
    assert read_router_reads(tmp_path, [0]) is None
    write_router_reads(tmp_path, {0: RouterRead(0.0, 0, [(1, 0.5), (2, 0.25)])})
    path = tmp_path / layout.ROUTER_READS
    path.write_text(path.read_text().replace("0.5 0.25", "0.5"))
    with pytest.raises(ArtifactError, match=r"router_reads\.csv: request 0 has 2 num_waiting"):
        read_router_reads(tmp_path, [0])
