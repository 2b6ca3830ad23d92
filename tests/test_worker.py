"""The Worker class in this process, against real connections."""

from __future__ import annotations

import os
import signal
import threading
from datetime import timedelta

import pytest
from django.db import connection, connections

import django_pgjobs
from django_pgjobs.enqueuing import JobSpec
from django_pgjobs.maintenance import Step, rescue_step
from django_pgjobs.models import Attempt, Job
from django_pgjobs.outcomes import Outcome
from django_pgjobs.status import AttemptOutcome, FailureClass, JobStatus, TerminalReason
from django_pgjobs.transitions import cancel_jobs, claim_jobs, rescue_expired_leases, settle
from django_pgjobs.worker import EXIT_EXECUTORS_LOST, Worker
from django_pgjobs.worker.core import ABANDONED_THREADS_PER_EXECUTOR
from django_pgjobs.worker.isolation import ChildProcess
from testproject.demo.models import LedgerEntry
from tests import handlers
from tests.conftest import ended_attempts, run_in_thread, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _reset_handlers():
    handlers.events.clear()
    handlers.gate.clear()
    yield
    handlers.gate.set()


def statuses() -> dict[int, str]:
    return dict(Job.objects.values_list("id", "status"))


def test_burst_drains_a_mixed_workload_and_exits() -> None:
    jobs = django_pgjobs.enqueue_many(
        [JobSpec.of("tests.ok", {"i": i}) for i in range(25)]
        + [JobSpec.of("tests.permanent", {}), JobSpec.of("tests.ok", {}, queue="other")]
    )
    worker = Worker(concurrency=2, batch_size=4, burst=True, install_signals=False,
                    poll_interval=0.05)
    assert worker.run() == 0
    final = statuses()
    assert [final[j.pk] for j in jobs].count(JobStatus.SUCCEEDED) == 26
    assert final[jobs[25].pk] == JobStatus.DEAD
    assert worker.counters.claimed == 27
    assert worker.counters.settled == {"succeeded": 26, "dead": 1}
    assert worker.counters.lost == 0


def test_max_jobs_stops_after_claiming_that_many() -> None:
    django_pgjobs.enqueue_many([JobSpec.of("tests.ok", {"i": i}) for i in range(10)])
    worker = Worker(batch_size=3, max_jobs=4, install_signals=False, poll_interval=0.05)
    assert worker.run() == 0
    assert Job.objects.filter(status=JobStatus.SUCCEEDED).count() == 4
    assert Job.objects.filter(status=JobStatus.READY).count() == 6


def test_only_the_named_queues_are_served() -> None:
    django_pgjobs.enqueue("tests.ok", {}, queue="a")
    django_pgjobs.enqueue("tests.ok", {}, queue="b")
    Worker(queues=["a"], burst=True, install_signals=False, poll_interval=0.05).run()
    assert dict(Job.objects.values_list("queue", "status")) == {
        "a": JobStatus.SUCCEEDED, "b": JobStatus.READY}


def test_stop_lets_the_running_handler_finish_and_releases_unstarted_jobs() -> None:
    gated = django_pgjobs.enqueue("tests.gated", {}, priority=10)
    rest = django_pgjobs.enqueue_many([JobSpec.of("tests.ok", {"i": i}) for i in range(3)])
    worker = Worker(batch_size=4, install_signals=False, poll_interval=0.05)
    thread = run_in_thread(worker)
    wait_for(lambda: ("gated-start", gated.pk) in handlers.events, 10)
    worker.stop()
    handlers.gate.set()
    thread.join(15)
    assert not thread.is_alive()
    assert Job.objects.get(pk=gated.pk).status == JobStatus.SUCCEEDED
    for job in rest:
        stored = Job.objects.get(pk=job.pk)
        assert (stored.status, stored.attempts, stored.lease_token) == (JobStatus.READY, 0, None)
        assert Attempt.objects.get(job_id=job.pk).outcome == AttemptOutcome.RELEASED


def test_a_signal_takes_no_lock_the_main_thread_may_hold_and_the_main_loop_drains() -> None:
    # The handler runs in the main thread between two bytecodes, perhaps while that thread holds
    # the lock inside the main loop's nudge (waiting on it or clearing it). Here another thread
    # holds that lock while the handler runs: a handler that set the nudge would wait for it.
    worker = Worker(install_signals=False, poll_interval=0.05, maintenance=[])
    handled = threading.Event()
    with worker._main_nudge._cond:
        signalled = threading.Thread(target=lambda: (
            worker._on_signal(signal.SIGTERM, None), handled.set()), daemon=True)
        signalled.start()
        assert handled.wait(2), "the signal handler waited on the main loop's lock"
    assert not worker.stopping  # noted; the main loop starts the drain
    job = django_pgjobs.enqueue("tests.ok", {})
    thread = run_in_thread(worker)
    thread.join(15)
    assert not thread.is_alive() and worker.stopping
    # Its executor may have claimed the job before the loop's first look: run, or handed back.
    assert Job.objects.get(pk=job.pk).status in (JobStatus.SUCCEEDED, JobStatus.READY)


@pytest.mark.slow
def test_heartbeats_keep_a_declared_long_job_owned_past_its_lease() -> None:
    job = django_pgjobs.enqueue("tests.long", {"seconds": 2.5})  # lease 1 s, heartbeats
    worker = Worker(install_signals=False, poll_interval=0.05, maintenance=[])
    thread = run_in_thread(worker)
    wait_for(lambda: Job.objects.get(pk=job.pk).status == JobStatus.RUNNING, 10)
    rescued = []
    while thread.is_alive() and Job.objects.get(pk=job.pk).status == JobStatus.RUNNING:
        rescued += rescue_expired_leases(10)
        threading.Event().wait(0.1)
    worker.stop()
    thread.join(10)
    stored = Job.objects.get(pk=job.pk)
    assert rescued == []
    assert (stored.status, stored.attempts, stored.result) == (JobStatus.SUCCEEDED, 1, "done")


@pytest.mark.slow
def test_a_heartbeat_that_finds_the_lease_gone_tells_the_handler() -> None:
    job = django_pgjobs.enqueue("tests.long", {"seconds": 1.5})
    worker = Worker(install_signals=False, poll_interval=0.05, maintenance=[])
    thread = run_in_thread(worker)
    wait_for(lambda: Job.objects.get(pk=job.pk).status == JobStatus.RUNNING, 10)
    # An operator or a rescuer took the lease: the token no longer matches.
    with connection.cursor() as cursor:
        cursor.execute("UPDATE pgjobs_job SET lease_token = gen_random_uuid() WHERE id = %s",
                       [job.pk])
    wait_for(lambda: worker.counters.lost == 1, 15)
    worker.stop()
    thread.join(10)
    # The handler, still running, read lease_lost as true: it answered "lost", not "done".
    assert handlers.events == [("long-returned", (job.pk, "lost"))]
    attempt = Attempt.objects.get(job_id=job.pk)
    assert attempt.outcome == AttemptOutcome.LOST
    assert Job.objects.get(pk=job.pk).status == JobStatus.RUNNING  # untouched by the stale report


def test_a_terminated_database_connection_mid_job_does_not_stop_the_worker() -> None:
    first = django_pgjobs.enqueue("tests.gated", {})
    worker = Worker(install_signals=False, poll_interval=0.05)
    thread = run_in_thread(worker)
    wait_for(lambda: ("gated-start", first.pk) in handlers.events, 10)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        assert cursor.fetchone()[0] >= 2  # the executor's and the settler's connections
    handlers.gate.set()
    wait_for(lambda: Job.objects.get(pk=first.pk).status == JobStatus.SUCCEEDED, 20)
    second = django_pgjobs.enqueue("tests.ok", {"after": "reconnect"})
    wait_for(lambda: Job.objects.get(pk=second.pk).status == JobStatus.SUCCEEDED, 20)
    worker.stop()
    thread.join(10)
    assert not thread.is_alive()
    assert worker.counters.database_errors >= 1


@pytest.mark.slow
def test_a_handler_hanging_past_its_lease_is_abandoned_and_the_worker_goes_on() -> None:
    hung = django_pgjobs.enqueue("tests.hang_once", {})
    worker = Worker(install_signals=False, poll_interval=0.05)
    thread = run_in_thread(worker)
    wait_for(lambda: ("hang-start", hung.pk) in handlers.events, 10)
    other = django_pgjobs.enqueue("tests.ok", {"while": "hung"})
    # Lease 1 s: the rescue step retries it, the watchdog starts a fresh executor after 2 s.
    wait_for(lambda: Job.objects.get(pk=other.pk).status == JobStatus.SUCCEEDED, 20)
    wait_for(lambda: Job.objects.get(pk=hung.pk).status == JobStatus.SUCCEEDED, 20)
    handlers.gate.set()  # the abandoned first attempt finally returns; its report must lose
    wait_for(lambda: worker.counters.lost == 1, 10)
    worker.stop()
    thread.join(10)
    # The rescue's record of the first attempt stands; its late success is kept beside it.
    outcomes = [(a.outcome, a.reported_outcome) for a in ended_attempts(hung.pk)]
    assert outcomes == [(AttemptOutcome.LEASE_EXPIRED, AttemptOutcome.SUCCEEDED),
                        (AttemptOutcome.SUCCEEDED, AttemptOutcome.SUCCEEDED)]
    assert Job.objects.get(pk=hung.pk).result == "second attempt"


def outcomes_of(job_id: int) -> list[str]:
    return [a.outcome for a in Job.objects.get(pk=job_id).attempt_history()]


@pytest.mark.slow
def test_jobs_queued_behind_a_declared_long_job_are_handed_back_at_once() -> None:
    long_job = django_pgjobs.enqueue("tests.long", {"seconds": 2.0}, priority=10)
    quick = django_pgjobs.enqueue_many([JobSpec.of("tests.ok", {"i": i}) for i in range(3)])
    worker = Worker(concurrency=2, batch_size=4, install_signals=False, poll_interval=0.05)
    thread = run_in_thread(worker)
    wait_for(lambda: Job.objects.get(pk=long_job.pk).status == JobStatus.SUCCEEDED, 20)
    worker.stop()
    thread.join(10)
    long_done = Job.objects.get(pk=long_job.pk).finished_at
    for job in quick:
        stored = Job.objects.get(pk=job.pk)
        assert stored.status == JobStatus.SUCCEEDED and stored.attempts == 1
        assert stored.finished_at < long_done  # another executor ran them meanwhile
        assert AttemptOutcome.LEASE_EXPIRED not in outcomes_of(job.pk)


@pytest.mark.slow
def test_jobs_waiting_behind_a_slow_handler_go_back_before_their_lease_expires() -> None:
    slow = django_pgjobs.enqueue("tests.sleep", {"seconds": 3.0}, priority=10)  # lease 5 s
    waiting = django_pgjobs.enqueue("tests.short_lease", {})  # lease 2 s
    worker = Worker(concurrency=1, batch_size=2, install_signals=False, poll_interval=0.05)
    thread = run_in_thread(worker)
    wait_for(lambda: Job.objects.get(pk=slow.pk).status == JobStatus.SUCCEEDED, 20)
    wait_for(lambda: Job.objects.get(pk=waiting.pk).status == JobStatus.SUCCEEDED, 20)
    worker.stop()
    thread.join(10)
    # Released by the watchdog after half its lease (while the slow handler still ran), not
    # rescued after expiry: no attempt was used up.
    assert outcomes_of(waiting.pk) == [AttemptOutcome.RELEASED, AttemptOutcome.SUCCEEDED]
    assert Job.objects.get(pk=waiting.pk).attempts == 1
    released = Attempt.objects.filter(job_id=waiting.pk).first()
    assert released.finished_at < Job.objects.get(pk=slow.pk).finished_at


def test_every_transition_logs_one_structured_line(caplog) -> None:
    job = django_pgjobs.enqueue("tests.ok", {}, trace_id="req-7")
    with caplog.at_level("DEBUG", logger="django_pgjobs"):
        Worker(burst=True, install_signals=False, poll_interval=0.05,
               worker_id="logging-worker").run()
    lines = [r for r in caplog.records if getattr(r, "pgjobs", {}).get("job_id") == job.pk]
    assert [r.pgjobs["outcome"] for r in lines] == ["claimed", "succeeded"]
    for record in lines:
        assert record.pgjobs["task"] == "tests.ok"
        assert record.pgjobs["attempt"] == 1
        assert record.pgjobs["worker"] == "logging-worker"
        assert record.pgjobs["trace_id"] == "req-7"
    assert lines[1].pgjobs["duration_ms"] is not None
    assert "trace=req-7" in lines[1].getMessage()


def test_a_report_that_cannot_be_stored_does_not_hold_back_the_others() -> None:
    import time

    from django_pgjobs.retry import Decision
    from django_pgjobs.status import FailureClass, TerminalReason

    good, bad = django_pgjobs.enqueue_many([JobSpec.of("tests.ok", {}) for _ in range(2)])
    claimed = {c.id: c for c in claim_jobs("w", "default", 2)}
    worker = Worker(install_signals=False, poll_interval=0.05)
    worker.settler.start()
    try:
        worker.settler.put(Outcome.succeeded(claimed[good.pk], "null", 1))
        worker.settler.put(Outcome.failed(
            claimed[bad.pk], FailureClass.PERMANENT,
            Decision(JobStatus.DEAD, None, TerminalReason.PERMANENT_ERROR),
            error="text PostgreSQL refuses: \x00",
        ))
        wait_for(lambda: worker.counters.settled.get("dead") == 1, 20)
    finally:
        worker.settler.stop(give_up_at=time.monotonic() + 5, timeout=5)
    assert Job.objects.get(pk=good.pk).status == JobStatus.SUCCEEDED
    stored = Job.objects.get(pk=bad.pk)
    assert stored.status == JobStatus.DEAD
    assert stored.last_error == "the worker's report could not be stored"


def test_the_next_claim_settles_what_is_pending_in_its_own_transaction() -> None:
    django_pgjobs.enqueue_many([JobSpec.of("tests.ok", {"n": i}) for i in range(5)])
    done = claim_jobs("w", "default", 2)
    worker = Worker(install_signals=False, poll_interval=0.05)
    for c in done:
        worker.settler.put(Outcome.succeeded(c, "null", 1))
    jobs = worker._claim(10)  # the settler thread is not even running
    assert len(jobs) == 3 and worker.settler.pending() == []
    assert worker.counters.settled == {"succeeded": 2}
    assert {Job.objects.get(pk=c.id).status for c in done} == {JobStatus.SUCCEEDED}


def test_with_settle_with_claim_off_the_settler_sends_each_full_batch_itself() -> None:
    import time

    from django.test import override_settings

    django_pgjobs.enqueue_many([JobSpec.of("tests.ok", {"n": i}) for i in range(5)])
    done = claim_jobs("w", "default", 2)
    with override_settings(PGJOBS_SETTLE_WITH_CLAIM=False):
        worker = Worker(install_signals=False, poll_interval=0.05, batch_size=2)
    for c in done:
        worker.settler.put(Outcome.succeeded(c, "null", 1))
    with worker.settler.lend() as loan:
        assert loan.outcomes == []  # nothing for a claim to carry
    assert len(worker._claim(10)) == 3 and worker.counters.settled == {}
    worker.settler.start()
    try:
        wait_for(lambda: worker.counters.settled == {"succeeded": 2}, 20)
    finally:
        worker.settler.stop(give_up_at=time.monotonic() + 5, timeout=5)


def test_a_claim_that_cannot_store_what_it_took_gives_it_back_to_the_settler() -> None:
    import time

    from django.db import DataError

    from django_pgjobs.retry import Decision
    from django_pgjobs.status import FailureClass, TerminalReason

    good, bad = django_pgjobs.enqueue_many([JobSpec.of("tests.ok", {}) for _ in range(2)])
    claimed = {c.id: c for c in claim_jobs("w", "default", 2)}
    django_pgjobs.enqueue_many([JobSpec.of("tests.ok", {"n": i}) for i in range(3)])
    worker = Worker(install_signals=False, poll_interval=0.05)
    worker.settler.put(Outcome.succeeded(claimed[good.pk], "null", 1))
    worker.settler.put(Outcome.failed(
        claimed[bad.pk], FailureClass.PERMANENT,
        Decision(JobStatus.DEAD, None, TerminalReason.PERMANENT_ERROR),
        error="text PostgreSQL refuses: \x00",
    ))
    with pytest.raises(DataError):
        worker._claim(5)
    # Nothing was settled or claimed, and no claim takes these again: the settler stores them.
    assert Job.objects.filter(status=JobStatus.READY).count() == 3
    assert len(worker.settler.pending()) == 2
    with worker.settler.lend() as loan:
        assert loan.outcomes == []
    worker.settler.start()
    try:
        wait_for(lambda: worker.counters.settled.get("dead") == 1, 20)
    finally:
        worker.settler.stop(give_up_at=time.monotonic() + 5, timeout=5)
    assert Job.objects.get(pk=good.pk).status == JobStatus.SUCCEEDED
    assert Job.objects.get(pk=bad.pk).last_error == "the worker's report could not be stored"
    assert len(worker._claim(5)) == 3


def test_settling_the_same_report_twice_keeps_the_first_record() -> None:
    job = django_pgjobs.enqueue("tests.ok", {})
    [c] = claim_jobs("w", "default", 1)
    report = Outcome.succeeded(c, '"once"', 1)
    assert settle([report]) == {c.lease_token: True}
    # Sent again, as after a reply lost with the connection: nothing changes.
    assert settle([report]) == {c.lease_token: False}
    stored = Job.objects.get(pk=job.pk)
    assert [(a.outcome, a.reported_outcome) for a in stored.attempt_history()] == [
        (AttemptOutcome.SUCCEEDED, AttemptOutcome.SUCCEEDED)]
    assert (stored.status, stored.result) == (JobStatus.SUCCEEDED, "once")


def test_while_the_database_is_unreachable_claimed_jobs_are_released_not_run() -> None:
    first = django_pgjobs.enqueue("tests.gated_db", {}, priority=10)
    rest = django_pgjobs.enqueue_many([JobSpec.of("tests.ok", {"i": i}) for i in range(2)])
    worker = Worker(batch_size=3, install_signals=False, poll_interval=0.05)
    thread = run_in_thread(worker)
    # A session on the server's maintenance database closes the test database to everyone.
    server = connections.create_connection("default")
    server.settings_dict = {**server.settings_dict, "NAME": "postgres"}
    name = connection.settings_dict["NAME"]
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        test_pid = cursor.fetchone()[0]
    try:
        wait_for(lambda: ("gated-db-start", first.pk) in handlers.events, 10)
        with server.cursor() as cursor:
            cursor.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
            try:
                cursor.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = %s AND pid <> %s", [name, test_pid]
                )
                handlers.gate.set()  # the handler's query fails; nobody can reconnect
                wait_for(lambda: worker.counters.database_errors >= 2, 20)
            finally:
                cursor.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS true')
        wait_for(lambda: all(Job.objects.get(pk=j.pk).status == JobStatus.SUCCEEDED
                             for j in [first, *rest]), 30)
    finally:
        server.close()
        worker.stop()
        thread.join(10)
    assert handlers.events.count(("ok", {"i": 0})) == 1  # ran once, after the outage
    for job in rest:
        assert outcomes_of(job.pk) == [AttemptOutcome.RELEASED, AttemptOutcome.SUCCEEDED]
        assert Job.objects.get(pk=job.pk).attempts == 1


def test_a_control_character_in_a_stored_trace_id_cannot_forge_a_log_line(caplog) -> None:
    job = django_pgjobs.enqueue("tests.ok", {})
    # Enqueue refuses it now; a row written by an older release or by hand may still hold one.
    Job.objects.filter(pk=job.pk).update(trace_id="t1\n2026-01-01 INFO job.succeeded id=999")
    caplog.set_level("DEBUG", logger="django_pgjobs")
    Worker(burst=True, install_signals=False, poll_interval=0.05).run()
    lines = [r.getMessage() for r in caplog.records if f"id={job.pk} " in r.getMessage()]
    assert lines, caplog.text
    for line in lines:
        assert "\n" not in line
        assert "trace=t1\\n2026-01-01 INFO job.succeeded id=999" in line


def test_the_settler_logs_a_database_error_without_the_data_it_quotes(caplog) -> None:
    django_pgjobs.enqueue("tests.ok", {})
    [claimed] = claim_jobs("w-ctx", "default", 1)
    # A report PostgreSQL refuses: the server's DETAIL and CONTEXT quote the offending JSON.
    broken = Outcome.succeeded(claimed, '{"password": "hunter22", "x": tru}', 1)
    worker = Worker(install_signals=False)
    caplog.set_level("WARNING", logger="django_pgjobs")
    worker.settler.flush([broken])
    assert "could not be stored together" in caplog.text
    assert "invalid input syntax for type json (SQLSTATE 22P02)" in caplog.text
    assert "hunter22" not in caplog.text and "CONTEXT" not in caplog.text
    # The report was stored without its result, and the job settled.
    assert Job.objects.get(pk=claimed.id).status == JobStatus.SUCCEEDED


@pytest.mark.parametrize("task", ["tests.upgrade_fails", "tests.upgrade_fails_async"])
def test_an_upgrade_that_raises_fails_its_job_and_the_worker_runs_the_next_one(
    task, caplog
) -> None:
    caplog.set_level("DEBUG")
    broken = django_pgjobs.enqueue(task, {"password": "hunter2-secret"}, payload_version=1,
                                   priority=10, max_attempts=1)
    after = django_pgjobs.enqueue("tests.ok", {"after": "upgrade"})
    worker = Worker(batch_size=1, burst=True, install_signals=False, poll_interval=0.05)
    assert worker.run() == 0
    stored = Job.objects.get(pk=broken.pk)
    # Its only attempt used up by an unknown failure, as a handler's ValueError would.
    assert (stored.status, stored.failure_class, stored.terminal_reason, stored.attempts) == (
        JobStatus.DEAD, FailureClass.UNKNOWN, TerminalReason.ATTEMPTS_EXHAUSTED, 1)
    assert stored.last_error.startswith("payload upgrade from version 1 failed: ValueError")
    assert Job.objects.get(pk=after.pk).status == JobStatus.SUCCEEDED
    assert worker.counters.settled == {"dead": 1, "succeeded": 1}
    assert "hunter2-secret" not in caplog.text + stored.last_error


def test_an_executor_that_fails_outside_a_job_hands_its_jobs_back_and_the_worker_exits_4(
    caplog
) -> None:
    jobs = django_pgjobs.enqueue_many([JobSpec.of("tests.ok", {"i": i}) for i in range(3)])
    worker = Worker(batch_size=3, install_signals=False, poll_interval=0.05)

    def broken_listener(claimed: list) -> None:
        raise RuntimeError("a claim listener failed")

    worker.claim_listeners.append(broken_listener)
    assert worker.run() == EXIT_EXECUTORS_LOST
    assert worker.counters.claimed == 3
    assert [Job.objects.get(pk=j.pk).status for j in jobs] == [JobStatus.READY] * 3
    assert list(Attempt.objects.values_list("outcome", flat=True)) == [
        AttemptOutcome.RELEASED] * 3
    died = [r for r in caplog.records if "worker.executor_died" in r.getMessage()]
    assert len(died) == 1 and "RuntimeError" in died[0].getMessage()


def test_one_failed_executor_of_several_does_not_end_the_worker(caplog) -> None:
    jobs = django_pgjobs.enqueue_many([JobSpec.of("tests.ok", {"i": i}) for i in range(6)])
    worker = Worker(concurrency=2, batch_size=1, burst=True, install_signals=False,
                    poll_interval=0.05)
    failed = threading.Event()

    def fails_once(claimed: list) -> None:
        if not failed.is_set():
            failed.set()
            raise RuntimeError("a claim listener failed")

    worker.claim_listeners.append(fails_once)
    # The other executor runs the burst to its end: the worker did not lose every executor.
    assert worker.run() == 0
    assert [s.crashed for s in worker._slots].count(True) == 1
    assert len([r for r in caplog.records if "worker.executor_died" in r.getMessage()]) == 1
    assert not [r for r in caplog.records if "worker.executors_lost" in r.getMessage()]
    assert worker.counters.settled["succeeded"] >= len(jobs) - 1


@pytest.mark.slow
def test_a_thread_that_runs_on_after_its_timeout_gives_its_executor_back(caplog) -> None:
    stuck = django_pgjobs.enqueue("tests.stuck_past_timeout", {})
    worker = Worker(install_signals=False, poll_interval=0.05, maintenance=[])
    thread = run_in_thread(worker)
    try:
        wait_for(lambda: Job.objects.get(pk=stuck.pk).status == JobStatus.DEAD, 20)
        after = django_pgjobs.enqueue("tests.ok", {"while": "stuck"})
        # One executor, still inside the timed-out handler: a second job runs all the same.
        wait_for(lambda: Job.objects.get(pk=after.pk).status == JobStatus.SUCCEEDED, 20)
        assert ("stuck-end", stuck.pk) not in handlers.events
    finally:
        handlers.gate.set()
    wait_for(lambda: worker.counters.lost == 1, 10)  # the handler's late report
    # Its thread ended: the given-up slot (and the connection it held) is gone.
    wait_for(lambda: len(worker._slots) == 1, 10)
    assert not worker._slots[0].abandoned
    worker.stop()
    thread.join(10)
    stored = Job.objects.get(pk=stuck.pk)
    assert (stored.status, stored.failure_class) == (JobStatus.DEAD, FailureClass.TIMEOUT)
    # The late report of the handler that ran on is kept beside its attempt's outcome.
    assert list(Attempt.objects.filter(job_id=stuck.pk).values_list(
        "outcome", "failure_class", "reported_outcome")) == [
            (AttemptOutcome.TIMED_OUT, FailureClass.TIMEOUT, AttemptOutcome.SUCCEEDED)]
    assert ("stuck-end", stuck.pk) in handlers.events
    assert len([r for r in caplog.records if "worker.abandon " in r.getMessage()]) == 1


def test_a_handler_returning_just_after_its_timeout_keeps_its_executor(caplog) -> None:
    job = django_pgjobs.enqueue("tests.returns_when_timed_out", {})
    worker = Worker(install_signals=False, poll_interval=0.05, maintenance=[])
    thread = run_in_thread(worker)
    # Told of the takeover, it returned, and its executor is free again.
    wait_for(lambda: ("told", job.pk) in handlers.events and worker._slots[0].job is None, 20)
    wait_for(lambda: outcomes_of(job.pk) == [AttemptOutcome.TIMED_OUT], 10)
    worker.stop()
    thread.join(10)
    # It returned within the grace: its thread was not given up, no executor was started.
    assert [r.getMessage() for r in caplog.records if "worker.abandon" in r.getMessage()] == []
    assert [(s.index, s.abandoned) for s in worker._slots] == [(0, False)]


@pytest.mark.slow
def test_past_the_limit_of_given_up_threads_a_stuck_executor_keeps_its_slot(caplog) -> None:
    limit = ABANDONED_THREADS_PER_EXECUTOR
    stuck = [django_pgjobs.enqueue("tests.stuck_past_timeout", {"n": n}, priority=100 - n)
             for n in range(limit + 1)]
    worker = Worker(install_signals=False, batch_size=1, poll_interval=0.05, maintenance=[])
    thread = run_in_thread(worker)
    try:
        # The first stuck threads are replaced, up to the limit; the one after is not.
        wait_for(lambda: any("worker.abandon_limit" in r.getMessage() and f"job={stuck[-1].pk} "
                             in r.getMessage() for r in caplog.records), 60)
        assert [s.abandoned for s in worker._slots] == [True] * limit + [False]
        wait_for(lambda: {Job.objects.get(pk=j.pk).status for j in stuck} == {
            JobStatus.DEAD}, 20)
    finally:
        handlers.gate.set()
    # Every stuck thread returned: the given-up slots and the note of the kept one are gone.
    wait_for(lambda: len(worker._slots) == 1 and not worker.watchdog._kept, 10)
    worker.stop()
    thread.join(10)
    assert not thread.is_alive()


# --- process isolation, with real child processes -----------------------------------------------


@pytest.mark.slow
def test_a_process_isolated_timeout_counts_from_the_handlers_start(monkeypatch) -> None:
    # The child's start-up alone (2 s) is longer than the handler's 1 s timeout.
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "tests.slow_child_settings")
    job = django_pgjobs.enqueue("demo.sleep_process", {"seconds": 0.2})
    worker = Worker(burst=True, install_signals=False, poll_interval=0.05, maintenance=[])
    assert worker.run() == 0
    stored = Job.objects.get(pk=job.pk)
    assert (stored.status, stored.failure_class) == (JobStatus.SUCCEEDED, "")
    assert stored.result not in (None, os.getpid())


@pytest.mark.slow
def test_a_process_isolated_handler_has_its_whole_lease_after_a_slow_start_up(
    monkeypatch, settings
) -> None:
    # The child's start-up (2 s of settings, then Django) takes more than a third of the 6 s
    # lease; the handler then runs 4.5 s, within its timeout. Had the lease kept counting from
    # the claim, it would end while the handler ran and the rescue would take the job over.
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "tests.slow_child_settings")
    settings.PGJOBS_RESCUE_BATCH = 10
    job = django_pgjobs.enqueue("demo.sleep_process", {"seconds": 4.5},
                                lease=timedelta(seconds=6), timeout=timedelta(seconds=8))
    worker = Worker(burst=True, install_signals=False, poll_interval=0.05,
                    maintenance=[Step("rescue", 0.1, rescue_step)])
    assert worker.run() == 0
    stored = Job.objects.get(pk=job.pk)
    assert (stored.status, stored.attempts, stored.failure_class) == (
        JobStatus.SUCCEEDED, 1, "")
    assert outcomes_of(job.pk) == [AttemptOutcome.SUCCEEDED]


def test_a_stop_before_the_child_is_up_keeps_the_handler_from_starting() -> None:
    django_pgjobs.enqueue("demo.process_effects", {"count": 3, "every": 0})
    [job] = claim_jobs("w1", "default", 1)
    child = ChildProcess(worker_id="w1", using="default")
    try:
        child.kill(job)  # a cancel or a timeout that came before the child was started
        assert child.run(job) is None
    finally:
        child.close()
    assert not LedgerEntry.objects.filter(job_id=job.id).exists()


def test_a_cancel_while_the_child_starts_up_keeps_the_handler_from_starting(
    monkeypatch, settings
) -> None:
    settings.PGJOBS_CANCEL_CHECK_SECONDS = 0.05
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "tests.slow_child_settings")
    job = django_pgjobs.enqueue("demo.process_effects", {"count": 3, "every": 0})
    worker = Worker(install_signals=False, poll_interval=0.05, maintenance=[])
    thread = run_in_thread(worker)
    wait_for(lambda: Job.objects.get(pk=job.pk).status == JobStatus.RUNNING, 10)
    cancel_jobs([job.pk])
    wait_for(lambda: Job.objects.get(pk=job.pk).status == JobStatus.CANCELLED, 10)
    worker.stop()
    thread.join(15)
    assert not thread.is_alive()
    # The worker waited for its children: one that had started the handler wrote rows.
    assert not LedgerEntry.objects.filter(job_id=job.pk).exists()
    assert outcomes_of(job.pk) == [AttemptOutcome.CANCELLED]
