"""What the tune prints: the ranked table's names and the target's answer."""

from __future__ import annotations

import math

import pandas as pd

from gpu_simulate_test.tune.report import ranked_cells, target_said
from gpu_simulate_test.tune.space import CONFIGURED_ID


def _row(config_id: str, configured: bool, rank: int) -> dict[str, object]:
    return {
        "rank": rank, "config_id": config_id, "configured": configured, "max_num_seqs": 32,
        "max_num_batched_tokens": 128, "enable_chunked_prefill": True,
        "num_gpu_blocks_override": 256, "enable_prefix_caching": False, "capacity_qps": 59.42,
        "goodput_qps": math.nan, "invalid": math.nan, "binding": "tpot_p90 35.1 > 30",
        "ttft_ms": 49.4, "tpot_ms": 27.1, "e2e_ms": 333.5, "measured_qps": math.nan,
    }  # fmt: skip


def test_the_configured_backend_is_named_once() -> None:
    """In the space, its id and "(configured)"; outside it, its id says so already."""
    frame = pd.DataFrame([_row("s32-t128", True, 1), _row(CONFIGURED_ID, True, 2),
                          _row("s8-t128", False, 3)])  # fmt: skip
    _, rows = ranked_cells(frame, "capacity", compact=True)
    assert [r[1] for r in rows] == ["s32-t128 (configured)", "configured", "s8-t128"]


def test_the_target_is_answered_with_its_configuration_capacity_and_headroom() -> None:
    answer = {"gpus": 2, "config_id": "r2-rr-s32-t128", "capacity_qps": 172.5,
              "headroom_pct": 15.0, "note": ""}  # fmt: skip
    assert target_said(answer) == (
        "2 GPU(s), r2-rr-s32-t128, simulated capacity 172.5 req/s (+15% headroom)"
    )
    none = {"gpus": None, "note": "no configuration serves 900 req/s within the goals"}
    assert target_said(none) == none["note"]


def test_the_shared_rate_is_called_the_configured_capacity_only_where_it_is_one() -> None:
    from gpu_simulate_test.tune.report import shared_rate_said

    assert shared_rate_said({"configured_score": 80.0}) == "the configured backend's capacity"
    for none in ({"configured_score": -1.0}, {"configured_score": None}, {}):
        said = shared_rate_said(none)
        assert "configured backend's capacity" not in said and "no simulated capacity" in said
