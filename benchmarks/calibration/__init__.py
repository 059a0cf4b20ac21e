"""The step model and the host's speed: calibrated steps against the steps servers ran."""
