"""specs/data_model.md is what the declared schemas say."""

from __future__ import annotations

from gpu_simulate_test.io.schemas import ALL_TABLES
from gpu_simulate_test.io.spec import render
from tests.conftest import REPO_ROOT


def test_spec_page_matches_the_schemas() -> None:
    page = (REPO_ROOT / "specs" / "data_model.md").read_text()
    assert page == render(), "regenerate: python -m gpu_simulate_test.io.spec > specs/data_model.md"
    for table in ALL_TABLES:
        assert f"### `{table.name}` (schema {table.version})" in page
