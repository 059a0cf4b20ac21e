"""The ``deep_profile`` stage: static analysis → torch profiler → nsys → ncu, one report.

:mod:`.stage` runs the enabled steps in order (:mod:`.steps`); each writes into its own
subfolder of ``tmp/deep_profile/<run_id>/`` (names in :mod:`.contract`); see
``docs/deep_profile.md``.
"""
