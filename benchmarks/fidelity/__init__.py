"""The simulator against the real engine: latencies, the front end, the scheduler's steps."""
