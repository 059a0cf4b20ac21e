"""Speed of the capacity search: ``--points`` rates (no bisection) of a ``--requests`` workload.

Tiny Qwen3 on a synthetic CPU bundle (as ``bench_vidur_simulate``), vLLM's knobs, no engine
overhead: the search's cost is its simulations. Prints the wall time per rate, the simulated
requests per second and the ratio to the target (issue 19: >= 8 rates of 10,000 requests in
<= 2 minutes). Run: ``python -m benchmarks.speed.bench_capacity [--requests 10000] [--points 8]``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from gpu_simulate_test.capacity.stage import run
from gpu_simulate_test.cli.registry import CONFIG_DIR, register_configs
from gpu_simulate_test.config.capacity import CapacityStageConfig
from gpu_simulate_test.config.registry import to_typed
from gpu_simulate_test.vidur_profile.synthetic import (
    QWEN3_TINY,
    SyntheticRanges,
    write_synthetic_bundle,
)

TARGET_S = 120.0


def main(argv: list[str] | None = None) -> None:
    from hydra import compose, initialize_config_dir

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--points", type=int, default=8)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-capacity-") as tmp:
        root = Path(tmp)
        # a bundle that covers the workload with the engine's block size (vLLM on CPU: 32),
        # so the search reuses it instead of profiling first
        ranges = SyntheticRanges(
            max_num_tokens=QWEN3_TINY.max_position_embeddings,
            max_kv_cache_size=QWEN3_TINY.max_position_embeddings,
            block_size=32,
        )
        write_synthetic_bundle(root / "profiles", ranges=ranges)
        register_configs()
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            composed = compose(
                "capacity",
                overrides=[
                    f"workload.num_requests={args.requests}",
                    f"capacity.points={args.points}",
                    "capacity.refine=0",
                    "capacity.qps_min=2",
                    "capacity.qps_max=200",
                    "engine_overhead=false",
                    f"profiling_root={root / 'profiles'}",
                    f"output.root={root}",
                    "output.run_id=bench",
                    "progress=false",
                ],
            )
        cfg = to_typed(composed, CapacityStageConfig)
        started = time.perf_counter()
        path = run(cfg, {})
        wall = time.perf_counter() - started
        doc = json.loads((path / "capacity.json").read_text())
    print(f"{args.points} rates x {args.requests} requests: {wall:.1f} s "
          f"({wall / args.points:.1f} s per rate), {doc['simulated_requests_per_s']} simulated "
          f"requests/s; answer {doc['answer_qps']} req/s")  # fmt: skip
    print(f"target: <= {TARGET_S:.0f} s -> ratio {wall / TARGET_S:.2f} (<= 1 meets it)")


if __name__ == "__main__":
    main()
