"""Vidur for our Qwen3 models: profiling bundle contract, model/device/predictor/scheduler
extensions and the ``vidur_simulate`` stage.

Nothing here imports Vidur at package import time; :func:`registration.register_vidur_extensions`
makes our classes known to Vidur, explicitly and once.
"""
