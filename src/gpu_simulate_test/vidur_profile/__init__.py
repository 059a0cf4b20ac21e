"""The ``vidur_profile`` stage: time a Qwen3 decoder layer's ops into a Vidur profiling bundle and
calibrate the serving engine's per-step cost on the real engine."""
