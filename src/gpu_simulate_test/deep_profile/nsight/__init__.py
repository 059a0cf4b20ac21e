"""Nsight Systems / Nsight Compute building blocks: command builders, CSV parsers, plots.

Nothing here runs a profiler; :mod:`.commands` builds argv lists, :mod:`.parsers` reads the CSVs
``nsys stats`` and ``ncu --csv`` write (values normalized by :mod:`.units`), :mod:`.classify`
turns ncu sections into bound labels and roofline points, :mod:`.plots` draws them, and
:mod:`.tools` finds the binaries. See ``docs/nsight.md``.
"""
