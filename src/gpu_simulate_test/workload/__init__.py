"""The ``workload`` stage: build a workload run from a synthetic spec, a trace or prompts."""
