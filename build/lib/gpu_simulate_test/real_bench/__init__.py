"""The real benchmark: replay a workload against a serving engine and time every token."""
