# The two commands a newcomer needs: `make demo` and `make test`. Each builds .venv when missing.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.solm-installed

.PHONY: demo test lint bench venv clean-venv

venv: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.lock
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

demo: $(STAMP)
	$(PY) bench/demo.py

# ruff (lint and format check) and mypy on the annotated packages, before any test runs
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy profiler simulator

test: $(STAMP) lint
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) bench/run_all.py $(if $(QUICK),--quick,)

clean-venv:
	rm -rf $(VENV)
