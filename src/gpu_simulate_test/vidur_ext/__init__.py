"""Vidur integration: the profiling bundle, Qwen3 model and device registration, simulation."""
