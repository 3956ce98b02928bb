# The two commands of the README: `make demo` and `make test` (each sets up .venv first).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

demo: setup
	$(VENV)/bin/tandem run specs/guess-number.yaml

test: setup
	$(PY) -m pytest -q --durations=15
