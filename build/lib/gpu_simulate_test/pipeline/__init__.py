"""The one-command pipeline: every stage, one set of overrides, the two sides' knobs matched."""
