# gpuplace: every target bootstraps what it needs; `make test` and `make demo` work on a fresh clone.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export GPUPLACE_CACHE ?= $(HOME)/.cache/gpuplace

.PHONY: help venv control-plane tools fakenvml lint test unit integration e2e demo bench cluster-up cluster-down clean

help:
	@echo "make test | demo | lint | bench | cluster-up | cluster-down | control-plane | clean"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

venv: $(STAMP)

control-plane:
	@hack/build-control-plane.sh >/dev/null

# helm (built from its Go module) and the third-party CRDs the chart and argocd/ are checked against.
tools:
	@hack/build-tools.sh >/dev/null

fakenvml:
	@$(MAKE) --no-print-directory -C tests/fakenvml

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

unit: $(STAMP) tools fakenvml
	$(BIN)/pytest tests/unit -q

integration: $(STAMP) control-plane tools fakenvml
	$(BIN)/pytest tests/integration -q

e2e: $(STAMP) control-plane fakenvml
	$(BIN)/pytest tests/e2e -q

test: $(STAMP) control-plane tools fakenvml
	$(BIN)/pytest tests -q

demo: $(STAMP) control-plane fakenvml
	$(BIN)/gpuplace demo

bench: $(STAMP) control-plane fakenvml
	$(BIN)/python -m bench

cluster-up: $(STAMP) control-plane fakenvml
	$(BIN)/gpuplace cluster up

cluster-down: $(STAMP)
	$(BIN)/gpuplace cluster down

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache tests/fakenvml/build
