"""The systems under test: where each keeps its jobs and how its workers are started."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench import harness

# Chancy's own command-line entry point, installed beside this interpreter.
CHANCY_CLI = os.path.join(os.path.dirname(harness.PYTHON), "chancy")
# Oban for Python needs Python 3.12 or newer, and this interpreter is the project's 3.11: its
# client and its CLI come from a virtualenv of their own (bench/requirements-oban.txt), which
# `make bench` makes and names in BENCH_OBAN_VENV (relative to the checkout).
OBAN_VENV = harness.ROOT / os.environ.get("BENCH_OBAN_VENV", ".venv-bench-oban")
OBAN_PYTHON = str(OBAN_VENV / "bin" / "python")
OBAN_CLI = str(OBAN_VENV / "bin" / "oban")
# Each worker's queue limit: at most this many jobs at once, and the most one fetch takes.
OBAN_LIMIT = 10


@dataclass(frozen=True)
class System:
    name: str
    database: str
    remaining_sql: str
    # Which client and worker: the name, unless this is a variant of another system.
    kind: str = ""
    env: dict[str, str] = field(default_factory=dict)
    # A worker that never exits on an empty queue (no burst mode) is stopped once the table
    # shows nothing outstanding; ``ready_sql`` counts a row once one has started.
    exits_when_empty: bool = True
    ready_sql: str = ""
    # Settings a worker takes from elsewhere than its command line, stated in the output.
    settings: str = ""
    # The interpreter that runs its client (``bench.measure``), when not the runner's own.
    python: str = ""

    def __post_init__(self) -> None:
        if self.client in ("pgjobs", "django-tasks-db"):  # their own apps only: bench/settings.py
            object.__setattr__(self, "env", {"BENCH_APPS": self.client, **self.env})

    @property
    def interpreter(self) -> str:
        return self.python or harness.PYTHON

    @property
    def client(self) -> str:
        return self.kind or self.name

    def worker_command(
        self, *, burst: bool, concurrency: int = 1, batch: int = 10
    ) -> list[str]:
        py, manage = harness.PYTHON, harness.MANAGE
        if self.client == "pgjobs":
            return [py, manage, "pgjobs_worker", "--concurrency", str(concurrency),
                    "--batch-size", str(batch), "--log-level", "WARNING",
                    *(["--burst"] if burst else [])]
        if self.client == "django-tasks-db":
            return [py, manage, "db_worker", "--no-startup-delay", "--no-reload",
                    *(["--batch"] if burst else [])]
        if self.client == "procrastinate":
            return [py, "-m", "bench.peers.procrastinate_app", "--concurrency", str(concurrency),
                    *(["--burst"] if burst else [])]
        if self.client == "pgqueuer":
            return [py, "-m", "bench.peers.pgqueuer_peer", "--dsn", harness.dsn(self.database),
                    "--batch-size", str(batch), *(["--burst"] if burst else [])]
        if self.client == "chancy":
            # Its queue's concurrency, executor and polling live in the database (see
            # bench/peers/chancy_app.py); it has no burst mode, so ``burst`` changes nothing.
            return [CHANCY_CLI, "--app", "bench.peers.chancy_app.app", "worker", "start"]
        if self.client == "oban":
            # One queue of OBAN_LIMIT; no burst mode, so ``burst`` changes nothing. The CLI
            # imports the jobs' module (bench/peers/oban_app.py) rather than grep the checkout.
            return [OBAN_CLI, "start", "--dsn", harness.dsn(self.database),
                    "--queues", f"default:{OBAN_LIMIT}", "--cron-modules",
                    "bench.peers.oban_app", "--log-level", "WARNING"]
        raise ValueError(f"no worker for {self.name}")

    def describe(self, command: Sequence[str]) -> str:
        """``command`` as the output shows it: programs by name, the database's URL left out."""
        names = {harness.PYTHON: "python", harness.MANAGE: "bench/manage.py",
                 CHANCY_CLI: "chancy", OBAN_CLI: "oban",
                 harness.dsn(self.database): "<its database>"}
        text = " ".join(names.get(arg, arg) for arg in command)
        return f"{text}; {self.settings}" if self.settings else text


PGJOBS = System(
    "pgjobs", "bench_pgjobs",
    "SELECT count(*) FROM pgjobs_job WHERE status IN ('ready', 'running')",
)
# The same code with Django's server_side_binding option: parameters travel apart from the SQL
# (nothing is prepared, not even the claim and settle pgjobs prepares by default; see
# bench/settings.py).
PGJOBS_SERVER_BINDING = System(
    "pgjobs (server-side binding)", PGJOBS.database, PGJOBS.remaining_sql, kind="pgjobs",
    env={"BENCH_SERVER_SIDE_BINDING": "1"},
)
# The same code with the claim's BEGIN and COMMIT sent apart, as psycopg sends them by itself
# (bench/experiments.py patches it in).
PGJOBS_CLAIM_APART = System(
    "pgjobs (BEGIN and COMMIT apart)", PGJOBS.database, PGJOBS.remaining_sql, kind="pgjobs",
    env={"BENCH_EXPERIMENT": "claim_begin_commit_apart"},
)
# The claim without its probe of pgjobs_queue, to price the pause check (bench/experiments.py).
PGJOBS_CLAIM_NO_PAUSE = System(
    "pgjobs (claim without the pause check)", PGJOBS.database, PGJOBS.remaining_sql,
    kind="pgjobs", env={"BENCH_EXPERIMENT": "claim_without_pause"},
)
DJANGO_TASKS_DB = System(
    "django-tasks-db", "bench_dtd",
    "SELECT count(*) FROM django_tasks_database_dbtaskresult WHERE status IN ('READY', 'RUNNING')",
)
PROCRASTINATE = System(
    "procrastinate", "bench_proc",
    "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')",
)
PGQUEUER = System("pgqueuer", "bench_pgq", "SELECT count(*) FROM pgqueuer")


def chancy_settings() -> str:
    """Its queue's settings (bench/peers/chancy_app.py); none where Chancy is not installed,
    for the benches that import this module without measuring it."""
    try:
        from bench.peers.chancy_app import SETTINGS
    except ImportError:
        return ""
    return SETTINGS


# A job stays 'running' until its worker's next batch of updates (one a second) records it.
CHANCY = System(
    "chancy", "bench_chancy",
    "SELECT count(*) FROM chancy_jobs WHERE state IN ('pending', 'retrying', 'running')",
    exits_when_empty=False, ready_sql="SELECT count(*) FROM chancy_workers",
    settings=chancy_settings(),
)
# Oban 0.7.0's defaults but the queue's limit, which the command line must give (OBAN_LIMIT, the
# limit Oban gives a queue configured without one). A job stays 'executing' until its worker
# acks it: the acks of a debounce window, one UPDATE each, in one transaction before its next
# fetch. 'suspended', Oban Pro's, never occurs here.
OBAN = System(
    "oban", "bench_oban",
    "SELECT count(*) FROM oban_jobs"
    " WHERE state IN ('available', 'scheduled', 'executing', 'retryable')",
    exits_when_empty=False, ready_sql="SELECT count(*) FROM oban_producers",
    settings=(
        f"its own Python 3.12+ virtualenv; one queue, limit {OBAN_LIMIT} (at most {OBAN_LIMIT} "
        "jobs at once, also the most one fetch takes: Oban has no batch size; "
        f"{OBAN_LIMIT} is the limit Oban gives a queue configured without one); async jobs on "
        "uvloop's event loop; Oban's defaults otherwise: a pool of 1 to 10 connections, the "
        "postgres notifier (an insert's NOTIFY wakes the queue), a 5 ms debounce between "
        "fetches, the stager every 1 s, leadership on, shutdown_grace_period 15 s; log level "
        "WARNING; no burst mode: stopped by SIGTERM once nothing is outstanding"
    ),
    python=OBAN_PYTHON,
)
FLOOR_DATABASE = "bench_floor"

PEERS = [DJANGO_TASKS_DB, PROCRASTINATE, PGQUEUER, CHANCY, OBAN]
ALL = [PGJOBS, *PEERS]
