"""The ``capacity`` stage: the highest request rate a deployment serves within latency goals, by
simulation (a grid of rates for the curve, then bisection), optionally checked on the real
engine."""
