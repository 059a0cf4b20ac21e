"""The Vidur profiling bundle: its files, its shape grid and its data checks."""
