# Two entry points on a fresh Linux machine with Python 3.11, pip and a C++ compiler:
#   make demo   set up .venv (CPU torch; stfast installed with its CPU kernels) and train DeepTTE on
#               the synthetic city into runs/demo (the main job; run again, it replaces runs/demo)
#   make test   set up .venv-test (the CUDA build of torch, so the CUDA kernels are compiled too when
#               nvcc is present; stfast installed editable) and run the tests, then every benchmark once
# The two environments hold different torch builds; the native extension is built against each.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
TEST_VENV ?= .venv-test
TEST_TORCH ?= torch==2.14.1
MAX_JOBS ?= 2
export MAX_JOBS
PY := $(VENV)/bin/python
TEST_PY := $(TEST_VENV)/bin/python
NATIVE_SRC := CMakeLists.txt $(shell find csrc -type f 2>/dev/null)

.PHONY: setup setup-test demo test clean

# Demo environment: a regular (non-editable) install, so its extension (built against $(TORCH)) does
# not collide with the editable test environment's extension in the source tree.
$(VENV)/.stfast-installed: pyproject.toml setup.py $(NATIVE_SRC)
	@echo "stfast: setting up $(VENV): $(TORCH) and stfast's dependencies (a few minutes, once) ..."
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "setuptools>=64" wheel "$(TORCH)"
	@echo "stfast: building stfast's CPU kernels and installing it (about 2 minutes) ..."
	$(PY) -m pip install -q --no-build-isolation ".[test]"
	touch $@

$(TEST_VENV)/.stfast-installed: pyproject.toml setup.py $(NATIVE_SRC)
	@echo "stfast: setting up $(TEST_VENV): $(TEST_TORCH) and the test dependencies, then building the kernels ..."
	test -x $(TEST_PY) || $(PYTHON) -m venv $(TEST_VENV)
	$(TEST_PY) -m pip install -q "setuptools>=64" wheel "$(TEST_TORCH)"
	mkdir -p build
	$(TEST_PY) -m pip install -v --no-build-isolation -e ".[test]" > build/pip-install-test.log 2>&1 \
	  || (tail -60 build/pip-install-test.log; exit 1)
	grep -E "stfast build|stfast: " build/pip-install-test.log
	$(TEST_PY) -c "import stfast, json; print('stfast build_info:', json.dumps(stfast.build_info()))"
	touch $@

setup: $(VENV)/.stfast-installed

setup-test: $(TEST_VENV)/.stfast-installed

# Each `make demo` replaces the previous demo run in runs/demo (--overwrite removes only stfast's own run
# files there; anything else in the folder, and every other folder under runs/, is left as it is)
demo: setup
	$(VENV)/bin/stfast train --epochs 6 --out runs/demo --overwrite

test: setup-test
	$(TEST_VENV)/bin/lint-imports  # the layer contract in pyproject.toml: no import circles
	$(TEST_PY) -m pytest -q tests
	$(TEST_PY) -m pytest -q benchmarks --benchmark-disable

clean:
	rm -rf $(VENV) $(TEST_VENV) build *.egg-info runs stfast/_C*.so stfast/_slicer*.so stfast/_prep*.so stfast/_emu*.so
