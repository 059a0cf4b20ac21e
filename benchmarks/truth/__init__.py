"""Can the real side be trusted: the real bench's client, its disturbance, its run-to-run spread."""
