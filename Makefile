# Two commands matter: `make demo` and `make test`. Both create .venv and install what they need.
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
BIN     = $(VENV)/bin

.PHONY: install demo test lint bench clean browser

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first, pinned, so nothing later pulls a different (multi-GB CUDA) build
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@

install: $(BIN)/.installed

demo: install
	$(BIN)/evalq demo

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# Debian's Chromium, for the run report's headless screenshot test (skipped without it).
browser:
	@command -v chromium >/dev/null || { \
	  SUDO=""; [ "$$(id -u)" -eq 0 ] || SUDO="sudo"; \
	  $$SUDO apt-get update -qq && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null || \
	  echo "could not install chromium: the report screenshot test will be skipped"; }

# Two pytest processes (pytest-xdist), each running whole test files: most of the suite's time
# is spent waiting on real worker processes and Redis, so two files at once use both cores.
test: lint browser
	$(BIN)/python -m pytest -n 2 --dist loadfile

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache evalq-demo

bench: install
	$(BIN)/python -m bench.throughput
	$(BIN)/python -m bench.padding
	$(BIN)/python -m bench.scorer_warm
	$(BIN)/python -m bench.scaling
	$(BIN)/python -m bench.isolation
