VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 8501

.PHONY: setup run test test-fast bench docs

setup:
	@bash scripts/setup.sh

# 1) set up on first use, then open the app in the browser
run: setup
	$(VENV)/bin/paged-kv-lab --server.port $(PORT)

# 2) set up on first use, then run the whole suite (real-model tests included)
test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q -ra

test-fast: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q -ra -m "not slow and not browser"

bench: setup
	$(PY) bench/bench_kvcore.py
	$(PY) bench/bench_engine.py
	$(PY) bench/bench_player.py

# the docs site (docs/ + mkdocs.yml) into site/; installs the docs extra (mkdocs < 2,
# mkdocs-material, at constraints.txt's versions) into the venv if missing
docs: setup
	@$(PY) -c "import material" 2>/dev/null || $(PY) -m pip install -q -c constraints.txt -e ".[docs]"
	$(PY) -m mkdocs build --strict --site-dir site
