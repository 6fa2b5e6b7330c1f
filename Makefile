# The two commands a newcomer needs: `make demo` and `make test`. Each builds .venv when missing.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.solm-installed

.PHONY: demo test bench venv clean-venv

venv: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.lock
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

demo: $(STAMP)
	$(PY) bench/demo.py

test: $(STAMP)
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) bench/run_all.py $(if $(QUICK),--quick,)

clean-venv:
	rm -rf $(VENV)
