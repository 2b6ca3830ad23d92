"""Shared fixtures: a second real connection, and real worker processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, connections

import tests.handlers  # noqa: F401  (registers the test handlers)

ROOT = Path(__file__).resolve().parent.parent
MANAGE = ROOT / "testproject" / "manage.py"


@pytest.fixture
def other_connection(transactional_db: None) -> Iterator[object]:
    """A second, independent connection to the test database."""
    conn = connections.create_connection("default")
    conn.ensure_connection()
    try:
        yield conn
    finally:
        conn.close()


def worker_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PGJOBS_DATABASE_NAME"] = connection.settings_dict["NAME"]
    env["DJANGO_SETTINGS_MODULE"] = "testproject.settings"
    env.setdefault("PGJOBS_LOG_LEVEL", "INFO")
    # A worker that does not exit in time is asked for every thread's stack (SIGUSR2, see
    # WorkerProcess.wait): the test's failure then says where it hangs.
    env["PGJOBS_DUMP_STACKS_ON_SIGUSR2"] = "1"
    env.update(extra)
    return env


class WorkerProcess:
    """A real ``manage.py pgjobs_worker`` process."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log_path = log
        self._log = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(MANAGE), "pgjobs_worker", *args],
            env=env, stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            # Every thread's stack into the log (faulthandler, registered by the test
            # project's settings), then the failure with the log's end.
            self.proc.send_signal(signal.SIGUSR2)
            time.sleep(1.0)
            self._log.flush()
            tail = "\n".join(self.output().splitlines()[-80:])
            raise AssertionError(f"worker {self.pid} still running after {timeout}s; its "
                                 f"threads and log:\n{tail}") from None
        finally:
            self._log.flush()

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self._log.close()


@pytest.fixture
def start_worker(transactional_db: None, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start real worker processes against the test database; all are killed at teardown."""
    started: list[WorkerProcess] = []

    def start(*args: str, **env: str) -> WorkerProcess:
        log = tmp_path / f"worker-{len(started)}.log"
        worker = WorkerProcess(list(args), worker_env(**env), log)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


def wait_for(predicate: Callable[[], object], timeout: float, interval: float = 0.05, *,
             what: Callable[[], str] | None = None) -> object:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds.

    ``what`` says, when it fails, the state the test was waiting on.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            said = f": {what()}" if what is not None else ""
            raise AssertionError(f"condition not met within {timeout}s{said}")
        time.sleep(interval)


def session(application_name: str) -> Any:
    """A connection of its own to the test database, named ``application_name``."""
    import psycopg

    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return psycopg.connect(**{**params, "application_name": application_name})


@contextmanager
def holding_snapshot(application_name: str) -> Iterator[int]:
    """A session holding a REPEATABLE READ snapshot open, as a long report does; its pid."""
    with session(application_name) as held:
        held.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        held.execute("SELECT count(*) FROM pgjobs_job").fetchone()
        yield held.info.backend_pid
        held.rollback()


def run_in_thread(worker: Any) -> threading.Thread:
    """Run ``worker`` (a Worker in this process) in a daemon thread, started."""
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    return thread


def plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node of an EXPLAIN (FORMAT JSON) plan, depth first."""
    nodes = [plan]
    for child in plan.get("Plans", []):
        nodes += plan_nodes(child)
    return nodes


def succeeded(claimed: Any, result: str = '{"ok": true}', *, token: Any = None) -> Any:
    """A success report for a claimed job, under its own lease token or the one given."""
    from django_pgjobs.outcomes import Outcome

    outcome = Outcome.succeeded(claimed, result, duration_ms=1)
    return outcome if token is None else replace(outcome, lease_token=token)


def ended_attempts(*job_ids: int) -> list[Any]:
    """The ended attempts of these jobs (of every job, given none) in claim order: their attempt
    rows, and their successes, which have none (``Job.success_attempt``)."""
    from django_pgjobs.models import KEPT_SUCCESS, Attempt, Job, in_claim_order

    jobs = Job.objects.filter(pk__in=job_ids) if job_ids else Job.objects.all()
    rows = list(Attempt.objects.filter(job__in=jobs))
    successes = [job.success_attempt() for job in jobs.filter(KEPT_SUCCESS)]
    return in_claim_order([*rows, *(a for a in successes if a is not None)])


def make_user(username: str, *codenames: str, superuser: bool = False) -> Any:
    """A staff user with these permissions of the pgjobs app.

    It has no usable password: the tests log it in with ``force_login``, and hashing one costs
    a quarter of a second per user.
    """
    from django.contrib.auth.models import Permission, User

    user = User.objects.create_user(username, is_staff=True, is_superuser=superuser)
    if codenames:
        user.user_permissions.set(
            Permission.objects.filter(content_type__app_label="pgjobs", codename__in=codenames)
        )
    return user


@pytest.fixture
def login(client: Any) -> Callable[..., Any]:
    """Log the test client in as a new staff user: ``login("view_job", superuser=False)``."""
    def log_in(*codenames: str, superuser: bool = False, username: str = "op") -> Any:
        client.force_login(make_user(username, *codenames, superuser=superuser))
        return client

    return log_in
