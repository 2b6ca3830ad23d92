# Two commands do all the set-up on a fresh machine:
#   make demo   workers drain a real mixed workload, one is killed mid-run, a summary is printed
#   make test   the whole suite
# Both use the PostgreSQL server in DATABASE_URL, or an embedded one when it is unset.

PYTHON ?= python3
VENV ?= .venv
DJANGO_SPEC ?=
PYTEST_ARGS ?=
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
MANAGE := $(PY) testproject/manage.py

.PHONY: venv test demo lint chaos bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]' $(if $(DJANGO_SPEC),'$(DJANGO_SPEC)')
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

demo: $(STAMP)
	$(MANAGE) migrate --verbosity 0
	$(MANAGE) run_demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy django_pgjobs
	$(MANAGE) makemigrations --check --dry-run

clean:
	rm -rf .venv .venv-* .pgdata
