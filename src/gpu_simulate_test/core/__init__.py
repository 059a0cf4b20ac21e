"""Workload generation and import: lengths, arrivals and prompts for replay and simulation."""
