"""What several stages share: workloads, requests, engines, the profiling bundle, the engine
overhead model, knobs, device, latency metrics, modeling and reporting. Imports only ``config``,
``io`` and itself."""
