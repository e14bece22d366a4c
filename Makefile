# rlcode: set-up, tests and runs. Every target installs what it needs itself (venv in .venv).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
# The CPU build on this kind of machine; on a GPU cluster use e.g. `make setup TORCH=torch`.
TORCH ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.rlcode-installed
# Tests and the quickstart read MBPP from the vendored copy beside the repo when nothing else is
# set; real users load it from the hub or point MBPP_DATASET_PATH at their own file.
SHARED_MBPP := $(abspath ../shared/data/mbpp/mbpp.jsonl)
export MBPP_DATASET_PATH ?= $(if $(wildcard $(SHARED_MBPP)),$(SHARED_MBPP),)

.PHONY: setup system-deps test unit integration quickstart bench clean

setup: $(STAMP)

# Short output: what is being installed, then the installed versions and the sandbox level
# (rlcode/setup_report.py); pip speaks only when something goes wrong.
PIP := $(PY) -m pip install -q --disable-pip-version-check
$(STAMP): pyproject.toml
	@$(MAKE) --no-print-directory system-deps
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing $(TORCH) and rlcode[dev] into $(VENV) ..."
	@$(PIP) --upgrade pip
	@$(PIP) "$(TORCH)"
	@$(PIP) -e ".[dev]"
	@$(PY) -m rlcode.setup_report
	@touch $@

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

# Everything CI runs: unit tests (tiny models) then integration tests (the real SmolLM2).
test: setup
	$(VENV)/bin/pytest -q -m "not integration"
	$(VENV)/bin/pytest -q -m integration

unit: setup
	$(VENV)/bin/pytest -q -m "not integration"

integration: setup
	$(VENV)/bin/pytest -q -m integration

quickstart: setup
	$(VENV)/bin/rlcode fit --config configs/quickstart.yaml

bench: setup
	$(PY) benchmarks/sandbox_throughput.py
	$(PY) benchmarks/step_throughput.py

clean:
	rm -rf $(VENV) runs lightning_logs .pytest_cache

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
	$(VLLM_STACK_VENV)/bin/python -m pytest -q -m "not integration" $(PYTEST_ARGS)
