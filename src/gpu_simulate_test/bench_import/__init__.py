"""The bench_import stage: read ``vllm bench serve`` and GuideLLM results as real runs, and
write ours in ``vllm bench serve``'s format."""
