"""A built wheel works from any directory: its configs ship inside it and nothing reads the
source tree. The wheel is built here, installed (without dependencies, which this environment
already has) into an empty directory that comes first on the path, and a stage runs from a
temporary directory with the checkout nowhere in sight."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def test_a_built_wheel_runs_a_stage_from_another_directory(tmp_path: Path) -> None:
    dist, site, work = tmp_path / "dist", tmp_path / "site", tmp_path / "work"
    work.mkdir()
    # built from a copy: setuptools builds in the source tree (build/), not in the checkout
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("*.egg-info",
                    "__pycache__"))  # fmt: skip
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(dist), str(source)],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    (wheel,) = dist.glob("gpu_simulate_test-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "gpu_simulate_test/configs/pipeline.yaml" in names
    assert "gpu_simulate_test/configs/model/qwen3_0_6b.yaml" in names
    assert "gpu_simulate_test/configs/experiment/fidelity_cpu_tiny.yaml" in names
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "-q",
         "--target", str(site), str(wheel)],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1"}
    where = subprocess.run(
        [sys.executable, "-c", "import gpu_simulate_test; print(gpu_simulate_test.__file__)"],
        cwd=work, env=env, check=True, capture_output=True, text=True,
    )  # fmt: skip
    assert where.stdout.strip().startswith(str(site))  # the wheel's copy, not the checkout
    proc = subprocess.run(
        [sys.executable, "-m", "gpu_simulate_test.cli.workload", "model=qwen3_0_6b",
         "workload.num_requests=5", "output.run_id=w", "progress=false"],
        cwd=work, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    meta = json.loads((work / "tmp" / "workload" / "w" / "run_meta.json").read_text())
    assert meta["status"] == "complete"
    # the model's numbers came from the wheel's configs
    assert meta["config"]["model"]["hidden_size"] == 1024
