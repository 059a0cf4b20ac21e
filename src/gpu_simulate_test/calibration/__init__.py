"""The engine calibration: plan the experiments (:mod:`.experiments`), drive the engine
(:mod:`.engine_steps`, :mod:`.frontend`, :mod:`.serving_replay`), fit its step time
(:mod:`.overhead`, :mod:`.serving_load`, :mod:`.frontend_queue`) and read the record back
(:mod:`.calibrated`)."""
