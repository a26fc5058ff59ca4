VENV ?= .venv
# Python may cache compiled modules here (.venv and the checkout's __pycache__, both ignored by
# git), whatever the calling shell says: the set-up's installer writes no .pyc files, and without
# them every process the suite starts (workers, servers, CLI runs) compiled torch, transformers
# and streamlit again, about 5 s of CPU each (8.3 s against 3.4 s to import them on 2 cores)
unexport PYTHONDONTWRITEBYTECODE
PY := $(VENV)/bin/python
PORT ?= 8501

.PHONY: setup run test test-fast bench docs

setup:
	@bash scripts/setup.sh

# 1) set up on first use, then open the app in the browser
run: setup
	$(VENV)/bin/paged-kv-lab --server.port $(PORT)

# 2) set up on first use, then run the whole suite (real-model and browser tests included) on
# TEST_WORKERS pytest-xdist workers (4 on 2 cores: browser tests spend much of their time waiting), then build the docs site with --strict into a temp folder
TEST_WORKERS ?= 4
PYTEST_XDIST := -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder
test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q -ra $(PYTEST_XDIST) --durations=25
	@site=$$(mktemp -d) && trap 'rm -rf "$$site"' EXIT && $(PY) -m mkdocs build --strict --site-dir "$$site"

test-fast: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q -ra $(PYTEST_XDIST) -m "not slow and not browser"

bench: setup
	$(PY) bench/bench_kvcore.py
	$(PY) bench/bench_engine.py
	$(PY) bench/bench_player.py

# the docs site (docs/ + mkdocs.yml) into site/ (the set-up installs mkdocs with the test tools)
docs: setup
	$(PY) -m mkdocs build --strict --site-dir site
