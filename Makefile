# Two entry points on a fresh Linux machine with Python 3.11, pip and a C++ compiler:
#   make demo   set up .venv and train DeepTTE on the synthetic city (the main job)
#   make test   set up .venv and run the test suite
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
PY := $(VENV)/bin/python

.PHONY: setup demo test clean

$(VENV)/.stfast-installed: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "setuptools>=64" wheel "$(TORCH)"
	$(PY) -m pip install -q --no-build-isolation -e ".[test]"
	touch $@

setup: $(VENV)/.stfast-installed

demo: setup
	$(VENV)/bin/stfast train --epochs 6 --out runs/demo

test: setup
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) build *.egg-info runs
