"""The shared steps of every orchestrator (``pipeline``, ``fidelity``, ``capacity``): how a real
run becomes a simulation, each step written once.

1. :mod:`.configs`: every stage's typed config built from the orchestrator's
   :class:`~gpu_simulate_test.config.pipeline.PipelineStageConfig`.
2. :mod:`.profiling`: plan (the scheduler derived from the engine's knobs, what the workload asks
   of the bundle, why the bundle does not fit) and profile when it does not.
3. :mod:`.serving`: one served engine for everything that talks to it (checked, recorded).
4. :mod:`.steps`: the workload, the truth (the real bench), and simulate-and-compare.

An orchestrator is a short recipe over these; none imports another orchestrator's ``stage``.
"""
