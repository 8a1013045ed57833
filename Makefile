# mmhost: `make demo` serves demo models, `make test` runs the tests. Both set everything up first.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)

.PHONY: setup demo lint test protos bench clean tools

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --disable-pip-version-check --upgrade pip
	# torch first and pinned: the CPU wheel on disk. An unpinned torch pulls a multi-GB CUDA build.
	$(PIP) install -q --disable-pip-version-check torch==2.13.0
	$(PIP) install -q --disable-pip-version-check -e ".[cpu,torch,sim,test]"
	@rm -f $(VENV)/.installed-*; touch $(STAMP)

setup: $(STAMP)

# Command-line tools some tests need (promtool, kubectl, hadolint); installed when missing.
tools:
	@bash .ci/install_tools.sh

demo: setup
	$(PY) -m mmhost.cli demo

# Guardrails (configured in pyproject.toml): package layers, ruff, and mypy on the ground floor and the
# pure policy modules. `make test` runs them first and stops on any finding.
lint: setup
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

test: setup tools lint
	$(PY) -m pytest -q -p no:cacheprovider

protos: setup
	$(PY) -m protos.generate

bench: setup
	$(PY) bench/batching.py

clean:  # the venv and every file `make demo` makes (store, tenants file, logs, caches, lock)
	rm -rf $(VENV) .mmhost-cache .mmhost-demo demo_store
