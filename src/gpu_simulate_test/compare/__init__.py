"""The ``compare`` stage: a real run against a simulated run of one workload (metrics, engine
steps, plots, reports), and the sweep report over several."""
