"""The ``vidur_simulate`` stage: Vidur for our Qwen3 models (model, device, predictor and scheduler
extensions) replaying a workload against a profiling bundle
(:mod:`gpu_simulate_test.core.profiling.bundle`).

Nothing here imports Vidur at package import time; :func:`registration.register_vidur_extensions`
makes our classes known to Vidur, explicitly and once.
"""
