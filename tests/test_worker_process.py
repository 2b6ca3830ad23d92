"""Real ``manage.py pgjobs_worker`` processes: killed, stopped, misconfigured."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

import django_pgjobs
from django_pgjobs.enqueuing import JobSpec
from django_pgjobs.models import Attempt, Job
from django_pgjobs.status import AttemptOutcome, FailureClass, JobStatus
from testproject.demo.models import LedgerEntry
from tests.conftest import MANAGE, ROOT, ended_attempts, wait_for, worker_env

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_job_whose_worker_is_killed_mid_job_is_completed_by_another_worker(start_worker):
    job = django_pgjobs.enqueue("demo.work", {"n": 1, "sleep": 30})  # lease 3 s
    doomed = start_worker("--worker-id", "doomed", "--poll-interval", "0.1")
    wait_for(lambda: Job.objects.filter(pk=job.pk, status=JobStatus.RUNNING).exists(), 30)
    doomed.signal(signal.SIGKILL)
    doomed.wait(10)
    Job.objects.filter(pk=job.pk).update(payload={"n": 1, "sleep": 0.01})
    rescuer = start_worker("--worker-id", "rescuer", "--poll-interval", "0.1")
    wait_for(lambda: Job.objects.get(pk=job.pk).status == JobStatus.SUCCEEDED, 60)
    rescuer.signal(signal.SIGTERM)
    assert rescuer.wait(30) == 0
    attempts = [(a.worker_id, a.outcome, a.failure_class) for a in ended_attempts(job.pk)]
    assert attempts == [
        ("doomed", AttemptOutcome.LEASE_EXPIRED, FailureClass.LEASE_EXPIRED),
        ("rescuer", AttemptOutcome.SUCCEEDED, ""),
    ]
    assert Job.objects.get(pk=job.pk).attempts == 2


def test_sigterm_drains_and_exits_zero_with_nothing_left_running(start_worker):
    django_pgjobs.enqueue_many(
        [JobSpec.of("demo.work", {"n": i, "sleep": 0.3}) for i in range(30)]
    )
    worker = start_worker("--concurrency", "2", "--batch-size", "5", "--poll-interval", "0.1")
    wait_for(lambda: Job.objects.filter(status=JobStatus.SUCCEEDED).count() >= 2, 60)
    worker.signal(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.output()
    assert Job.objects.filter(status=JobStatus.RUNNING).count() == 0
    assert Attempt.objects.filter(outcome=AttemptOutcome.RUNNING).count() == 0
    counts = {s: Job.objects.filter(status=s).count()
              for s in (JobStatus.SUCCEEDED, JobStatus.READY)}
    assert counts[JobStatus.SUCCEEDED] + counts[JobStatus.READY] == 30
    assert counts[JobStatus.READY] > 0  # it stopped before draining everything
    assert "worker.drain" in worker.output()
    # Released jobs did not use an attempt.
    assert set(Job.objects.filter(status=JobStatus.READY).values_list("attempts", flat=True)) == {0}


def test_a_poison_job_that_kills_its_worker_every_time_ends_dead(start_worker):
    poison = django_pgjobs.enqueue("demo.poison", {})  # max_attempts 3, lease 2 s
    fine = django_pgjobs.enqueue("demo.noop", {"n": 1})
    for _ in range(3):
        worker = start_worker("--poll-interval", "0.1")
        assert worker.wait(60) == -signal.SIGKILL
    survivor = start_worker("--poll-interval", "0.1")
    wait_for(lambda: Job.objects.get(pk=poison.pk).status == JobStatus.DEAD, 60)
    wait_for(lambda: Job.objects.get(pk=fine.pk).status == JobStatus.SUCCEEDED, 60)
    survivor.signal(signal.SIGTERM)
    assert survivor.wait(30) == 0
    stored = Job.objects.get(pk=poison.pk)
    assert (stored.attempts, stored.terminal_reason) == (3, "attempts_exhausted")
    assert list(Attempt.objects.filter(job_id=poison.pk).values_list("outcome", flat=True)) == [
        AttemptOutcome.LEASE_EXPIRED] * 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--concurrency", "0"], "must be from 1 to 100, got 0"),
        (["--concurrency", "101"], "must be from 1 to 100, got 101"),
        (["--batch-size", "99999999999999999999"],
         "must be from 1 to 1000, got 99999999999999999999"),
        (["--batch-size", "0"], "must be from 1 to 1000, got 0"),
        (["--queue", "a b"], "the queue must be a queue name"),
        (["--queue", "billing:0"], "the weight must be from 1 to 100, got 0"),
        (["--worker-id", "w\nforged"], "must not contain control characters"),
        (["--worker-id", ""], "must not be empty"),
        (["--batch-size", "ten"], "'ten' is not a whole number"),
        (["--poll-interval", "-1"], "must be a finite number from 0.01 to 3600, got -1"),
        (["--poll-interval", "1e-300"], "must be a finite number from 0.01 to 3600, got 1e-300"),
        (["--poll-interval", "nan"], "must be a finite number from 0.01 to 3600, got nan"),
        (["--max-jobs", "0"], "must be at least 1"),
        (["--queue", ""], "the queue must be a queue name (1 to 64 letters"),
        (["--database", "nope"], "unknown database alias 'nope'"),
        (["--frobnicate"], "unrecognized arguments: --frobnicate"),
    ],
)
def test_bad_flags_exit_non_zero_with_a_clear_message(args, message):
    result = subprocess.run(
        [sys.executable, str(MANAGE), "pgjobs_worker", *args], cwd=ROOT, env=worker_env(),
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode != 0
    assert message in result.stderr


def unreachable_env(port: int, give_up_seconds: str) -> dict[str, str]:
    env = worker_env(DATABASE_URL=f"postgres://pgjobs@127.0.0.1:{port}/nowhere",
                     PGJOBS_BURST_UNREACHABLE_SECONDS=give_up_seconds)
    del env["PGJOBS_DATABASE_NAME"]  # the database named in the URL, not the test database
    return env


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_burst_worker_that_cannot_reach_its_database_gives_up_with_a_clear_log():
    port = closed_port()
    env = unreachable_env(port, "1.5")
    result = subprocess.run(
        [sys.executable, str(MANAGE), "pgjobs_worker", "--burst"], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 3, result.stderr
    attempts = [line for line in result.stderr.splitlines() if "worker.database_error" in line]
    # One line per backoff step (0.1, 0.2, 0.4, 0.8 s ...), each naming what it tried and why.
    assert len(attempts) >= 3, result.stderr
    for line in attempts:
        assert f"during=connect database=pgjobs@127.0.0.1:{port}/nowhere" in line
        assert "retry_in=" in line and "error=" in line
    assert "worker.give_up" in result.stderr
    assert f"gave up: database pgjobs@127.0.0.1:{port}/nowhere could not be reached" in (
        result.stderr)


def test_a_long_running_worker_keeps_retrying_an_unreachable_database():
    port = closed_port()
    env = unreachable_env(port, "0.5")
    proc = subprocess.Popen(
        [sys.executable, str(MANAGE), "pgjobs_worker"], cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(4)  # far past the burst limit: a service outlives an outage
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    assert stderr.count("worker.database_error") >= 3
    assert "worker.give_up" not in stderr


def children_of(pid: int) -> list[int]:
    """The live processes whose parent is ``pid`` and that run a spawned Python child."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        # The second field (the command) may hold spaces: the fields after it follow ") ".
        state, ppid = stat.rpartition(") ")[2].split()[:2]
        if int(ppid) == pid and state != "Z" and b"spawn_main" in cmdline:
            found.append(int(entry.name))
    return found


def gone(pid: int) -> bool:
    """Whether ``pid`` has ended (exited, or killed and left unreaped as a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(") ")[2].split()[0] == "Z"


def inserts_running() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
                       "AND query LIKE 'INSERT INTO \"demo_ledgerentry\"%%'")
        return bool(cursor.fetchone()[0])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_process_isolated_handler_writes_nothing_after_its_worker_is_killed(start_worker):
    job = django_pgjobs.enqueue("demo.process_effects", {"count": 2000, "every": 0.02})
    worker = start_worker("--poll-interval", "0.1")
    wait_for(lambda: LedgerEntry.objects.filter(job_id=job.pk).count() >= 5, 60)
    [child] = wait_for(lambda: children_of(worker.pid), 30)
    try:
        # Freeze the child between two rows, so the last row before the kill is known: once
        # its statement in flight (if any) has finished, nothing more can come from it.
        os.kill(child, signal.SIGSTOP)
        wait_for(lambda: not inserts_running(), 30)
        last_before_kill = LedgerEntry.objects.filter(job_id=job.pk).latest("id").id
        worker.signal(signal.SIGKILL)
        assert worker.wait(30) == -signal.SIGKILL
        # A child that survived its worker would go on writing once it runs again.
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGCONT)
        wait_for(lambda: gone(child), 30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
    assert list(LedgerEntry.objects.filter(job_id=job.pk, id__gt=last_before_kill)) == []
    assert Job.objects.get(pk=job.pk).status == JobStatus.RUNNING  # until its lease runs out


def test_an_upgrade_that_raises_fails_its_job_and_the_worker_goes_on_printing_no_payload(
    start_worker,
):
    broken = django_pgjobs.enqueue("demo.upgraded", {"password": "hunter2-secret"},
                                   payload_version=1, priority=10, max_attempts=1)
    after = django_pgjobs.enqueue("demo.noop", {"n": 1})
    worker = start_worker("--poll-interval", "0.1", PGJOBS_LOG_LEVEL="DEBUG")
    wait_for(lambda: Job.objects.get(pk=after.pk).status == JobStatus.SUCCEEDED, 60)
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output()
    stored = Job.objects.get(pk=broken.pk)
    # A ValueError, from a handler or its upgrade, is an unknown failure: its one attempt used.
    assert (stored.status, stored.failure_class, stored.attempts) == (
        JobStatus.DEAD, FailureClass.UNKNOWN, 1)
    assert stored.last_error == ("payload upgrade from version 1 failed: ValueError: cannot "
                                 "upgrade {'password': [redacted]}: no account_id")
    assert "hunter2-secret" not in worker.output()
