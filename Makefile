# `make demo` runs the main job, `make test` runs the whole suite, `make test-fast` its part not marked slow.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint install clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	# SGLang's own source for the twin's fidelity tests (protocol models, routes, metrics): no deps,
	# so none of its GPU stack; msgspec is the one light package its protocol.py adds.
	$(BIN)/pip install -q --no-deps sglang==0.5.23
	$(BIN)/pip install -q 'msgspec>=0.18'
	# vLLM's own source for the vLLM adapter's and twin's fidelity tests (metric declarations, routes,
	# protocol models), read as text or under stub parents (backends/sim/vllm_ref.py): nothing of it
	# imports without torch, so no deps.
	$(BIN)/pip install -q --no-deps vllm==0.33.0
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/cachegate demo

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

# The tests not marked `slow` (a test is slow if it takes more than 5 s on a 2-core machine, or starts
# a multi-process stack: several gateway workers, docker compose, Prometheus and Grafana).
test-fast: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not slow" $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) cachegate-report .pytest_cache
