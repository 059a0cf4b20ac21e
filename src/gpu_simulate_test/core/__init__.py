"""What several stages share, one folder per subject: ``traffic/`` (the requests a run sends),
``metrics/`` (latency metrics, percentiles, a run's summary), ``profiling/`` (Vidur's profiling
bundle), ``model/`` (Qwen3 from its config, the device), ``host/`` (the host's health while we
time), ``engines/`` (the real engines the truth runs on, their knobs and records); a run's inputs
(``run_inputs``) and the terminal (``reporting``). Imports only ``config``, ``io`` and itself."""
