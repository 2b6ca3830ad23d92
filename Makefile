# Two commands do all the set-up on a fresh machine:
#   make demo   workers drain a real mixed workload, one is killed mid-run, a summary is printed
#   make test   the whole suite
# Both use the PostgreSQL server in DATABASE_URL, or an embedded one when it is unset, which
# stops when the command returns (testproject/embedded.py runs each command as its user).
#   make test-quick  while you edit: the suite without the tests marked slow (worker and child
#               processes, the browser, PgBouncer, other servers, large history, long waits)
#   make admin  after make demo: the admin on the demo's data, at http://127.0.0.1:8000/admin/

PYTHON ?= python3
VENV ?= .venv
DJANGO_SPEC ?=
PYTEST_ARGS ?=
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
MANAGE := $(PY) testproject/manage.py
EMBEDDED := $(PY) -m testproject.embedded

.PHONY: venv system-deps test test-quick demo admin screenshots lint chaos failover bench soak bench-held-growth profile compare bench-async \
	bench-lifecycle bench-limits bench-workflows bench-remote clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]' $(if $(DJANGO_SPEC),'$(DJANGO_SPEC)')
	touch $(STAMP)

venv: $(STAMP)

# Debian packages the suite drives for real: chromium for the admin's browser tests (Playwright
# never downloads a browser) and PgBouncer for the transaction-pooling test. Both scripts do
# nothing when the package is already there; otherwise they install it with apt-get as root, or
# through sudo, and without either they say what is missing and how to install it
# (.ci/apt-install).
system-deps:
	bash .ci/install-browser
	bash .ci/install-pgbouncer

test: $(STAMP) system-deps
	$(EMBEDDED) $(PY) -m pytest $(PYTEST_ARGS)

# The edit-test loop: no slow test needs the Debian packages, so neither does this.
test-quick: $(STAMP)
	$(EMBEDDED) $(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

# The demo's backlog policy, schedules and history interval, for its workers and for the admin
# alike: the dashboard checks the policy and charts the samples (one every 5 s, so the short
# run draws a line), and the schedules page lists what the workers declared.
DEMO_ENV := PGJOBS_BACKLOG_MAX_AGE_SECONDS='{"default": 60, "reports": 600}' \
	PGJOBS_HISTORY_INTERVAL_SECONDS=5 \
	PGJOBS_SCHEDULES='{"demo.every-minute": {"task": "demo.tick", "cron": "* * * * *", \
	"payload": {"schedule": "every-minute"}}, "demo.nightly-report": {"task": "demo.tick", \
	"cron": "0 3 * * *", "timezone": "Europe/London", "payload": {"schedule": "nightly"}}}'

demo: $(STAMP)
	$(EMBEDDED) $(MANAGE) migrate --verbosity 0
	$(DEMO_ENV) $(EMBEDDED) $(MANAGE) run_demo

# The test project's server on loopback only, static files served by runserver (--insecure).
ADMIN_PORT ?= 8000
admin: $(STAMP)
	$(EMBEDDED) $(MANAGE) migrate --verbosity 0
	$(DEMO_ENV) $(EMBEDDED) $(MANAGE) runserver --insecure --noreload 127.0.0.1:$(ADMIN_PORT)

# The operations guide's quick-start pictures, taken again by the browser test that numbers them.
screenshots: $(STAMP) system-deps
	$(EMBEDDED) $(PY) -m pytest -q tests/browser/test_console_browser.py -k quick_start
	for f in artifacts/quick-start/*.png; do cp "$$f" "docs/images/quick-start-$$(basename $$f)"; done

# mypy's Django plugin and makemigrations load the settings, which join the embedded server when
# DATABASE_URL is unset: run through it, so it stops when they are done.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(EMBEDDED) sh -c '$(VENV)/bin/mypy django_pgjobs && $(MANAGE) makemigrations --check --dry-run'

# The failure harness: real workers against a private PostgreSQL server that it crashes and
# restarts (never the one in DATABASE_URL); prints its figures, fails if an invariant broke.
#   make chaos                                  the long run (a few minutes)
#   make chaos CHAOS_ARGS="--profile ci --seed 2 --keep"   the test suite's run, keeping logs
CHAOS_ARGS ?=

chaos: $(STAMP)
	$(PY) -m tests.harness $(CHAOS_ARGS)

# The failover harness: a private primary and a streaming standby (pg_basebackup -R), workers
# on a host list with target_session_attrs=read-write, the standby promoted mid-drain after the
# primary was crashed under synchronous replication (sync), crashed after a forced second of
# replication lag (async), or turned read-only under its workers (readonly); --mode all, the
# default, runs the three. Fails if an enforced check broke; reports what the async run lost.
#   make failover FAILOVER_ARGS="--mode readonly --seconds 20 --keep"
FAILOVER_ARGS ?=

failover: $(STAMP)
	$(PY) -m tests.harness.failover $(FAILOVER_ARGS)

# Benchmarks: the peers are installed into their own virtualenv, never into the project's.
#   make bench                         the full run (about 15 minutes); BENCH_ARGS=--quick to check
#   make soak SOAK_ARGS="--minutes 10" sustained load, table size and claim latency over time
#   make bench-held-growth             bytes per job each relation grows by under a held snapshot
#   make profile                       round trips per claim/settle and where worker CPU goes
#   make compare REV=HEAD~3            drain with this checkout and REV, interleaved, one run
#   make bench-async                   one worker: async handlers next to executor threads on I/O
#   make bench-lifecycle               how fast a cancel reaches each kind of handler, and a pause
#   make bench-workflows               1,000 chains of 10 and 100 chords of 100 beside plain jobs:
#                                      throughput, and each waiting job's hand-over latency
#   make bench-limits                  a drain under per-key limits beside an unlimited one, a
#                                      hot key's 10,000 jobs beside 1,000 others (head-of-line),
#                                      and two rate keys' starts over a minute (rates held)
#   make bench-remote                  as root: workers in two network namespaces, reaching the
#                                      server through a delay proxy at 0, 1 and 5 ms added RTT;
#                                      REMOTE_ARGS=--quick to check
BENCH_VENV ?= .venv-bench
BENCH_PY := $(BENCH_VENV)/bin/python
BENCH_STAMP := $(BENCH_VENV)/.installed
# Oban for Python needs Python 3.12 or newer, and the bench virtualenv is the project's 3.11: its
# worker command and its client run from a virtualenv of their own (bench/requirements-oban.txt),
# made with the first Python 3.12+ among pyenv's versions, else python3.13 or python3.12 on the
# PATH (as .ci/run finds one); PYTHON_OBAN=/path/to/python3.12 to choose. The runner stays on
# the bench virtualenv's Python and starts Oban's processes with this one's (BENCH_OBAN_VENV).
BENCH_OBAN_VENV ?= .venv-bench-oban
BENCH_OBAN_PY := $(BENCH_OBAN_VENV)/bin/python
BENCH_OBAN_STAMP := $(BENCH_OBAN_VENV)/.installed
PYTHON_OBAN ?= $(shell root=$$(pyenv root 2>/dev/null || echo "$$HOME/.pyenv"); \
	ls -d "$$root"/versions/3.1[2-9]*/bin/python3 2>/dev/null | sort -V | head -n 1 | grep . \
	|| command -v python3.13 || command -v python3.12)
BENCH_ARGS ?=
SOAK_ARGS ?=
REMOTE_ARGS ?=

$(BENCH_STAMP): pyproject.toml bench/requirements.txt
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_PY) -m pip install --quiet --upgrade pip
	$(BENCH_PY) -m pip install --quiet -e '.[dev]' -r bench/requirements.txt
	touch $(BENCH_STAMP)

$(BENCH_OBAN_STAMP): bench/requirements-oban.txt
	@test -n "$(PYTHON_OBAN)" || { echo "Oban for Python needs Python 3.12 or newer and none" \
		"was found: install one, or name it with PYTHON_OBAN=/path/to/python3.12" >&2; exit 1; }
	$(PYTHON_OBAN) -m venv $(BENCH_OBAN_VENV)
	$(BENCH_OBAN_PY) -m pip install --quiet --upgrade pip
	$(BENCH_OBAN_PY) -m pip install --quiet -r bench/requirements-oban.txt
	touch $(BENCH_OBAN_STAMP)

bench: $(BENCH_STAMP) $(BENCH_OBAN_STAMP)
	BENCH_OBAN_VENV=$(BENCH_OBAN_VENV) $(BENCH_PY) -m bench.run $(BENCH_ARGS)

soak: $(BENCH_STAMP)
	$(BENCH_PY) -m bench.soak $(SOAK_ARGS)

bench-held-growth: $(BENCH_STAMP)
	$(BENCH_PY) -m bench.held_growth $(HELD_GROWTH_ARGS)

profile: $(BENCH_STAMP)
	$(BENCH_PY) -m bench.profile_hot_path

REV ?= HEAD
COMPARE_ARGS ?=
compare: $(BENCH_STAMP)
	$(BENCH_PY) -m bench.compare $(REV) $(COMPARE_ARGS)

bench-async: $(BENCH_STAMP)
	$(BENCH_PY) -m bench.async_io

bench-lifecycle: $(BENCH_STAMP)
	$(BENCH_PY) -m bench.lifecycle

bench-limits: $(BENCH_STAMP)
	$(BENCH_PY) -m bench.limits $(LIMITS_ARGS)

bench-workflows: $(BENCH_STAMP)
	$(BENCH_PY) -m bench.workflows $(WORKFLOWS_ARGS)

bench-remote: $(BENCH_STAMP)
	$(BENCH_PY) -m bench.remote $(REMOTE_ARGS)

clean:
	rm -rf .venv .venv-* .pgdata
