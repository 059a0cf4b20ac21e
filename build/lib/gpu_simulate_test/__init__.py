"""gpu-simulate-test: predict LLM serving latency with Vidur, measure it on GPUs, compare."""

__version__ = "0.1.0"
