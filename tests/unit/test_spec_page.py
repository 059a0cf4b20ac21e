"""specs/data_model.md is what the declared schemas say."""

from __future__ import annotations

from gpu_simulate_test.spec import declared_tables, render
from tests.conftest import REPO_ROOT


def test_spec_page_matches_the_schemas() -> None:
    page = (REPO_ROOT / "specs" / "data_model.md").read_text()
    assert page == render(), "regenerate: python -m gpu_simulate_test.spec > specs/data_model.md"
    names = [table.name for table in declared_tables()]
    assert len(names) == len(set(names)), "two declared tables share a name"
    assert {"request_metrics", "vidur_mlp", "telemetry"} <= set(names)
    for table in declared_tables():
        assert f"### `{table.name}` (schema {table.version})" in page
