"""The bundle schema is Vidur's: the real Vidur mlp.csv validates against it, column for column."""

from __future__ import annotations

import pandas as pd

from gpu_simulate_test.io.artifacts import read_csv
from gpu_simulate_test.vidur_ext.bundle import MLP_TABLE
from tests.conftest import SHARED_FIXTURES

REAL_MLP = SHARED_FIXTURES / "vidur" / "mlp_llama2_7b_a100_head40.csv"


def test_real_vidur_mlp_profile_matches_our_schema() -> None:
    header = pd.read_csv(REAL_MLP, nrows=0).columns.tolist()
    assert header == MLP_TABLE.column_names
    frame = read_csv(REAL_MLP, MLP_TABLE)
    assert len(frame) == 40 and frame["use_gated_mlp"].all()
    assert frame["time_stats.mlp_up_proj.median"].gt(0).all()
