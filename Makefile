# The two commands of the README: `make demo` and `make test` (each sets up .venv first).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup setup-test demo test tunix-venv word-problems
setup: $(VENV)/.installed  # Tandem and what it needs to run: all the demo needs
setup-test: $(VENV)/.installed-test  # and the test extras (pytest, CPU torch, transformers)

$(VENV)/.installed: pyproject.toml
	@echo "Installing Tandem and its dependencies into $(VENV) (once; a few minutes)"
	python3 -m venv $(VENV)
	$(PY) -m pip install -qq --upgrade pip
	$(PY) -m pip install -qq -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	@echo "Installing the test extras into $(VENV) (once; torch and transformers: a few minutes)"
	$(PY) -m pip install -qq -e '.[test]'
	touch $@

# Google's Tunix in a venv of its own, apart from Tandem's dependencies, for the measurements
# of benchmarks/beside/tunix_side.py. CPU jax by default; on a GPU machine:
# `make tunix-venv TUNIX_JAX='jax[cuda12]==0.10.2'`.
TUNIX_VENV ?= .venv-tunix
TUNIX_JAX ?= jax[cpu]==0.10.2
tunix-venv: $(TUNIX_VENV)/.installed
$(TUNIX_VENV)/.installed:
	@echo "Installing google-tunix into $(TUNIX_VENV) (once; a few minutes)"
	python3 -m venv $(TUNIX_VENV)
	$(TUNIX_VENV)/bin/python -m pip install -qq --upgrade pip
	$(TUNIX_VENV)/bin/python -m pip install -qq google-tunix==0.1.7 '$(TUNIX_JAX)' \
		flax==0.12.8 optax==0.2.8 safetensors==0.7.0 numpy==2.4.6
	touch $@

# A Ctrl-C interrupts make with tandem ("Error 130"), and make ends as interrupted: the
# shell's $? is 130. Where tandem alone is signalled, make says "Error 143" and exits 2.
demo: setup
	$(VENV)/bin/tandem run specs/guess-number.yaml --fresh

# The LLM-shaped agent of specs/word-problems.yaml: its model made here first (random
# weights of qwen2's 25M shape, a BPE tokenizer trained on generated text: ~20 s).
models/qwen2-25m: | setup
	$(VENV)/bin/tandem new-model qwen2-25m $@
word-problems: setup models/qwen2-25m
	$(VENV)/bin/tandem run specs/word-problems.yaml

# A dot per test as it passes, the slowest 15 at the end. Two processes (pytest-xdist): much
# of a test's time is compiling or waiting on other processes, which a second test fills;
# the tests that read the session's small run (`tiny_run`) share one process.
TEST_WORKERS ?= 2
test: setup-test
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup --durations=15
