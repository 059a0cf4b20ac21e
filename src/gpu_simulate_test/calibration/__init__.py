"""The engine calibration: plan the experiments (:mod:`.experiments`), drive the engine
(:mod:`.engine_steps`, :mod:`.frontend`, :mod:`.serving_replay`), read the steps' costs
(:mod:`.step_times`), fit its step time (:mod:`.overhead`, :mod:`.serving_load`,
:mod:`.frontend_queue`) and read the record back (:mod:`.record`); shared helpers in
:mod:`.common`, which imports none of the others."""
