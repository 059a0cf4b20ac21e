"""Hydra entry points, one per stage: ``python -m gpu_simulate_test.cli.<stage>``."""
