# Entry points: `make demo` runs the pipeline end to end, `make test` runs the whole suite.
# Both create .venv on first use (Python 3.11) and install what they need.

# bash with pipefail: a failing install shows through the filter that shortens its output.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c

PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv browser bytecode demo demo-engine demo-stages test test-unit test-e2e stress lint bench picture clean

venv: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) not found: install Python 3.11 or pass PYTHON=/path/to/python3.11"; exit 1; }
	@echo "==> [1/4] creating $(VENV) with $(PYTHON)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@echo "==> [2/4] installing the pinned packages (first time: about 2 minutes; one line each)"
	$(PY) -m pip install --progress-bar off -r requirements-dev.txt \
	  | { grep --line-buffered -E '^(Collecting|Successfully installed)' || true; }
	# The Spark provider pulls pyspark-client, whose files overwrite pyspark's own
	# Python sources with another version; put pyspark 4.3.0's back.
	@echo "==> [3/4] restoring pyspark 4.3.0's own sources"
	$(PY) -m pip install --quiet --no-deps --force-reinstall pyspark==4.3.0
	@echo "==> [4/4] installing microcheckpoint itself (editable)"
	$(PY) -m pip install --quiet --no-deps -e .
	@touch $(STAMP)
	@echo "==> $(VENV) is ready"

# The browser tests drive Debian's chromium with Playwright (no browser download).
CHROMIUM ?= /usr/bin/chromium
browser: $(CHROMIUM)

$(CHROMIUM):
	@echo "==> installing Debian's chromium for the browser tests (apt-get, as root)"
	@[ "$$(id -u)" = 0 ] || { echo "chromium is missing: run 'sudo apt-get install chromium' or pass CHROMIUM=/path/to/chromium"; exit 1; }
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null

# The pipeline through Airflow's scheduler; `make demo KEEP=1` leaves it running.
# `make demo SPARK=cluster`: the Connect server's master is a standalone master with two
# workers on loopback (executors in JVMs of their own) instead of local[2].
demo: $(STAMP) bytecode
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" KEEP="$(KEEP)" SPARK="$(SPARK)" $(PY) -m harness.demo

# The engine alone (no Airflow): Spark epochs with a kill -9 of one epoch's job.
demo-engine: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m harness.demo_engine

# Two stages joined by an internal topic: one aligned and one unaligned checkpoint, then a
# global savepoint and a restore of both stages with rescale.
demo-stages: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m harness.demo_stages

# The project's own modules compiled once, before the suite and the demo start their
# hundreds of Python processes (epoch jobs, CLI calls, Spark's Python workers, Airflow's
# task and parsing processes). Where PYTHONDONTWRITEBYTECODE is set, as on this project's
# machines, no process writes a .pyc, so each compiled from source what it imported: about
# a tenth of a CLI test file's CPU (docs/testing.md). `make bench` compiles them too, as
# installing the package would. Python checks each .pyc against its source's time and
# size, so a stale one is never used.
bytecode: $(STAMP)
	$(PY) -m compileall -q -j 0 microcheckpoint microcheckpoint_airflow harness tests spark_jobs dags examples bench >/dev/null

# Lint first: CI runs `make test` only, so style is checked there too. Three workers on two
# cores: much of the suite waits on services (Airflow's scheduler, broker restarts, holds),
# and a third worker fills that time (docs/testing.md gives the measured times). Files go
# out in collection order, which tests/conftest.py makes longest first: xdist's default
# (most tests first) left the longest single-test files for last.
WORKERS ?= 3
test: lint browser bytecode
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" CHROMIUM="$(CHROMIUM)" $(PY) -m pytest -n $(WORKERS) --dist loadfile --no-loadscope-reorder --durations=25 $(PYTEST_ARGS)

test-e2e: $(STAMP) browser
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" CHROMIUM="$(CHROMIUM)" $(PY) -m pytest tests/e2e $(PYTEST_ARGS)

test-unit: $(STAMP)
	$(PY) -m pytest tests/unit tests/property $(PYTEST_ARGS)

# Randomized stress (tests/integration/test_stress.py): seeded random produce, cycle,
# kill -9, savepoint and restore steps, checked after each. A failure names its seed and
# steps: `make stress SEEDS=<seed> STEPS=<n>` replays it. Ends with the table of the runs.
SEEDS ?= 1 2 3
STEPS ?= 40
STRESS_REPORT ?= /tmp/microcheckpoint-stress.jsonl
stress: $(STAMP)
	rm -f $(STRESS_REPORT)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" STRESS_SEEDS="$(SEEDS)" STRESS_STEPS="$(STEPS)" \
	  STRESS_REPORT="$(STRESS_REPORT)" $(PY) -m pytest tests/integration/test_stress.py \
	  -n 2 --dist load $(PYTEST_ARGS) || failed=$$?; \
	$(PY) -m harness.stress $(STRESS_REPORT); exit $${failed:-0}

bench: $(STAMP) bytecode
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m bench.bench_checkpoint_bytes
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m bench.s3_requests
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m bench.run_all $(BENCH_ARGS)

# mypy strict on the protocol (pure, the core every edge relies on); imported modules are
# followed for their types but not reported.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy --strict --follow-imports=silent microcheckpoint/protocol/

# Redraw the pictures of README.md and docs/ from their sources (standard library only).
picture:
	python3 docs/architecture.py
	python3 docs/stages_picture.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
