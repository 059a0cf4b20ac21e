"""A current bundle seen as an older calibration (issue 63, item 9): the command around
:mod:`gpu_simulate_test.orchestrate.older_view`.

Run::

    python -m benchmarks.fidelity.older_view tmp/profiles/cpu/qwen3_tiny tmp/profiles_v9 --version 9
    python -m benchmarks.fidelity.bench_sim_variants RUN [RUN ...] \\
        --variant v11=profiling_root=tmp/profiles_v11 --variant v9=profiling_root=tmp/profiles_v9
"""

from __future__ import annotations

from gpu_simulate_test.orchestrate.older_view import main

if __name__ == "__main__":
    main()
