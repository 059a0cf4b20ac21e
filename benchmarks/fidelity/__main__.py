"""The fidelity campaign is the ``fidelity`` stage now (docs/fidelity.md); this wrapper runs it.

``python -m benchmarks.fidelity [overrides]`` is ``python -m gpu_simulate_test.cli.fidelity
[overrides]``. The old harness's ``--preset`` names the experiment config to use instead.
"""

from __future__ import annotations

import sys

PRESETS = {
    "cpu_tiny": "fidelity_cpu_tiny",
    "gpu_0_6b": "fidelity_qwen3_0_6b_h100",
}
"""The argparse harness's presets → the stage's experiment configs."""


def main() -> None:
    args = sys.argv[1:]
    if any(a.startswith("--") and not a.startswith("--cfg") for a in args):
        old = args[args.index("--preset") + 1] if "--preset" in args[:-1] else None
        experiment = PRESETS.get(old or "", "fidelity_cpu_tiny")
        sys.exit(
            "benchmarks.fidelity takes the fidelity stage's Hydra overrides now, e.g.\n"
            f"  python -m gpu_simulate_test.cli.fidelity +experiment={experiment}\n"
            "  (--backend B: backend=B; --real-repeats N: fidelity.real_repeats=N; --phase real "
            "--out D: fidelity.phase=real output.root=D; --phase sim --from D: fidelity.phase=sim "
            "fidelity.real_from=D/fidelity/<run_id>; --summarize F...: "
            "'fidelity.summarize=[F,...]'); see docs/fidelity.md"
        )
    from gpu_simulate_test.cli.fidelity import main as stage

    stage()


if __name__ == "__main__":
    main()
