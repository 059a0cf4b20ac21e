"""Request latency metrics, percentiles, goodput, a run's summary and its measured window."""
