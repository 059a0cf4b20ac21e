"""The ``tune`` stage: vLLM's engine knobs searched by simulation under latency goals."""
