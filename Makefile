# Developer entry points. Every target creates the virtualenv on first use and
# reinstalls the package only when pyproject.toml changes.
#
#   make demo    run the example project's end-to-end demo on a throwaway PostgreSQL
#   make serve   run the example shop (admin + worker) on a throwaway PostgreSQL
#   make test    run the test suite on a throwaway PostgreSQL
#   make lint    ruff check and ruff format --check
#   make docs    build the documentation (mkdocs --strict)
#
# Set DATABASE_URL to use your own PostgreSQL instead of a throwaway one.

PYTHON ?= python3
VENV ?= .venv
BIN := $(abspath $(VENV))/bin
PY := $(BIN)/python
PIP_INSTALL := $(PY) -m pip install --quiet --disable-pip-version-check
SERVE_ADDR ?= 127.0.0.1:8000
PYTEST_ARGS ?=

# The embedded PostgreSQL (or $DATABASE_URL) for one command; the venv's python first
# on PATH so that `python` inside `sh -c` is the venv's.
WITH_POSTGRES := PATH="$(BIN):$$PATH" $(PY) scripts/with_postgres.py --

.DEFAULT_GOAL := help
.PHONY: help demo serve test lint docs clean

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

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

docs: $(VENV)/.installed-docs
	$(BIN)/mkdocs build --strict

clean:
	rm -rf build dist site .pytest_cache .ruff_cache example_project/media
	find . -name __pycache__ -type d -not -path "./$(VENV)/*" -prune -exec rm -rf {} +
