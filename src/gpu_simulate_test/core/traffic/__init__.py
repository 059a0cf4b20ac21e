"""The traffic a run sends: workloads sampled or imported, sessions, shared prefixes, prompts of
exact lengths."""
