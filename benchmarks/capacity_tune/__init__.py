"""The capacity search and the tune against capacities measured on real vLLM servers."""
