"""Lifecycle control: unique while active, enforced timeouts, cancellation that sticks, paused
queues, receipts fenced by the lease. Real PostgreSQL; real worker processes where processes
matter (a thread that loops forever cannot be left in the test process)."""

from __future__ import annotations

import signal
import threading
import time
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, connections
from django.db.models.functions import Now
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

import django_pgjobs
from django_pgjobs import Cancelled, LeaseLost, TimedOut
from django_pgjobs.context import JobContext
from django_pgjobs.enqueuing import JobSpec
from django_pgjobs.executor import execute
from django_pgjobs.models import Attempt, IdempotencyReceipt, Job, OperatorAction, QueueState
from django_pgjobs.outcomes import Outcome
from django_pgjobs.status import AttemptOutcome, FailureClass, JobStatus, TerminalReason
from django_pgjobs.transitions import (
    cancel_jobs,
    claim_jobs,
    pause_queue,
    ready_queues,
    rescue_expired_leases,
    resume_queue,
    retry_jobs,
    settle,
)
from django_pgjobs.worker import Worker
from django_pgjobs.worker.aio import AsyncRunner
from django_pgjobs.worker.running import RunningJobs
from django_pgjobs.worker.settler import Settler, SettlerConfig
from django_pgjobs.worker.slots import BatchRunner, Slot
from testproject.chaos.models import Effect, Run
from tests.conftest import ended_attempts, wait_for

transactional = pytest.mark.django_db(transaction=True)


def finish(job_id: int) -> None:
    [claimed] = [c for c in claim_jobs("w", "default", 10) if c.id == job_id]
    assert settle([Outcome.succeeded(claimed, "null", 1)]) == {claimed.lease_token: True}


# --- unique while active ---------------------------------------------------------------------


@pytest.mark.django_db
def test_a_unique_key_returns_the_active_job_and_is_free_once_it_finished() -> None:
    first = django_pgjobs.enqueue("tests.ok", {"v": 1}, unique_key="refresh:42")
    again = django_pgjobs.enqueue("tests.ok", {"v": 2}, unique_key="refresh:42",
                                  delay=timedelta(minutes=5))
    assert (again.pk, again.created) == (first.pk, False)
    assert Job.objects.count() == 1
    # Another task may use the same key.
    other = django_pgjobs.enqueue("tests.transient", {}, unique_key="refresh:42")
    assert other.created and other.pk != first.pk
    finish(first.pk)
    after = django_pgjobs.enqueue("tests.ok", {"v": 3}, unique_key="refresh:42")
    assert after.created and after.pk != first.pk
    assert Job.objects.get(pk=after.pk).payload == {"v": 3}


@pytest.mark.django_db
@pytest.mark.parametrize("status", [JobStatus.SCHEDULED, JobStatus.RETRYING, JobStatus.RUNNING])
def test_every_active_state_holds_the_key(status) -> None:
    first = django_pgjobs.enqueue("tests.ok", {}, unique_key="k")
    if status == JobStatus.RUNNING:
        claim_jobs("w", "default", 1)
    else:
        Job.objects.filter(pk=first.pk).update(status=status)
    again = django_pgjobs.enqueue("tests.ok", {}, unique_key="k")
    assert (again.pk, again.created) == (first.pk, False)


@pytest.mark.django_db
def test_a_unique_period_holds_the_key_within_its_period_whatever_the_state() -> None:
    first = django_pgjobs.enqueue("tests.ok", {}, unique_key="daily", unique_period=86400)
    finish(first.pk)
    again = django_pgjobs.enqueue("tests.ok", {}, unique_key="daily", unique_period=86400)
    stored = Job.objects.get(pk=first.pk)
    assert stored.unique_period_start is not None
    assert stored.unique_period_start.timestamp() % 86400 == 0
    assert (again.pk, again.created) == (first.pk, False)


@transactional
def test_a_period_ends_and_the_next_one_takes_a_new_job() -> None:
    first = django_pgjobs.enqueue("tests.ok", {}, unique_key="tick", unique_period=1)
    wait_for(lambda: django_pgjobs.enqueue("tests.ok", {}, unique_key="tick",
                                           unique_period=1).pk != first.pk, 10)
    starts = list(Job.objects.order_by("id").values_list("unique_period_start", flat=True))
    assert len(starts) == 2 and starts[1] > starts[0]


@pytest.mark.django_db
def test_enqueue_many_with_unique_keys_pairs_every_spec() -> None:
    held = django_pgjobs.enqueue("tests.ok", {}, unique_key="a")
    jobs = django_pgjobs.enqueue_many([
        JobSpec.of("tests.ok", {"n": 1}, unique_key="a"),
        JobSpec.of("tests.ok", {"n": 2}, unique_key="b"),
        JobSpec.of("tests.ok", {"n": 3}, unique_key="b"),
        JobSpec.of("tests.ok", {"n": 4}),
    ])
    assert [j.created for j in jobs] == [False, True, False, True]
    assert jobs[0].pk == held.pk and jobs[2].pk == jobs[1].pk
    assert Job.objects.count() == 3


@transactional
def test_concurrent_enqueuers_of_one_key_make_exactly_one_active_job() -> None:
    results: list[tuple[int, bool]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def enqueue_many_times() -> None:
        try:
            start.wait()
            for _ in range(15):
                job = django_pgjobs.enqueue("tests.ok", {}, unique_key="race")
                results.append((job.pk, job.created))
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=enqueue_many_times) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert len(results) == 90
    assert len({pk for pk, _ in results}) == 1
    assert sum(created for _, created in results) == 1
    assert Job.objects.filter(unique_key="race").count() == 1


@transactional
def test_an_enqueue_waits_for_an_uncommitted_holder_and_takes_the_key_if_it_rolls_back() -> None:
    holder = connections.create_connection("default")
    holder.set_autocommit(False)
    try:
        with holder.cursor() as cursor:  # a caller's transaction that inserted the key
            cursor.execute(
                "INSERT INTO pgjobs_job (task, payload_version, queue, payload, status, priority,"
                " base_priority, run_at, attempts, max_attempts, snoozes, lease_seconds,"
                " unique_key, trace_id, failure_class, terminal_reason, last_error, created_at,"
                " updated_at) VALUES ('tests.ok', 1, 'default', '{}', 'ready', 0, 0, now(), 0,"
                " 5, 0, 30, 'pending', '', '', '', '', now(), now())")
        found: list[Any] = []
        waiter = threading.Thread(target=lambda: (found.append(
            django_pgjobs.enqueue("tests.ok", {"mine": True}, unique_key="pending")),
            connections.close_all()))
        waiter.start()
        time.sleep(0.5)
        assert waiter.is_alive()  # blocked on the unique index by the uncommitted row
        holder.rollback()
        waiter.join(30)
    finally:
        holder.close()
    assert found and found[0].created
    assert list(Job.objects.values_list("payload", flat=True)) == [{"mine": True}]


@pytest.mark.django_db
def test_an_operator_retry_leaves_a_job_whose_key_an_active_job_holds() -> None:
    dead = django_pgjobs.enqueue("tests.ok", {}, unique_key="once")
    Job.objects.filter(pk=dead.pk).update(status=JobStatus.DEAD, finished_at=Now())
    active = django_pgjobs.enqueue("tests.ok", {}, unique_key="once")
    assert active.created
    assert retry_jobs([dead.pk]) == 0
    assert Job.objects.get(pk=dead.pk).status == JobStatus.DEAD
    audit = OperatorAction.objects.get()
    assert audit.detail["held_elsewhere"] == [dead.pk]


@pytest.mark.django_db
@pytest.mark.parametrize(("options", "message"), [
    ({"unique_period": 60}, "unique_period needs a unique_key"),
    ({"unique_key": ""}, "unique_key must not be empty"),
    ({"unique_key": "k", "unique_period": 0}, "unique_period must be from 1 to"),
    ({"timeout": 0}, "timeout must be above 0"),
    ({"timeout": "1"}, "timeout must be a timedelta or a number of seconds"),
])
def test_bad_lifecycle_options_are_refused_before_any_sql(options, message) -> None:
    with pytest.raises(django_pgjobs.InvalidJobOption, match=message):
        django_pgjobs.enqueue("tests.ok", {}, **options)
    assert Job.objects.count() == 0


@pytest.mark.parametrize(("options", "message"), [
    ({"timeout": -1}, "timeout must be above 0"),
    ({"isolation": "fiber"}, "isolation must be one of thread, process"),
    # Defaults that every enqueue would refuse, by the same rule, refused at import instead.
    ({"priority": 500}, "priority must be a whole number from -100 to 100"),
    ({"priority": True}, "priority must be a whole number"),
    ({"max_attempts": 0}, "max_attempts must be a whole number from 1 to"),
    ({"version": 40_000}, "version must be a whole number from 1 to 32767"),
    ({"version": 0}, "version must be a whole number from 1 to 32767"),
    ({"max_age": timedelta(0)}, "max_age must be above 0"),
    ({"lease": timedelta(days=8)}, "lease must be from 1 to"),
    ({"lease": timedelta(seconds=0.5)}, "lease must be from 1 to"),
    ({"queue": "no spaces"}, "queue "),
])
def test_bad_handler_lifecycle_options_are_refused_at_declaration(options, message) -> None:
    with pytest.raises(django_pgjobs.InvalidJobOption, match=message):
        django_pgjobs.job("tests.lifecycle.bad", **options)(lambda ctx, payload: None)


def test_an_async_handler_cannot_ask_for_a_process() -> None:
    async def handler(ctx: Any, payload: Any) -> None:
        return None

    with pytest.raises(django_pgjobs.InvalidJobOption, match="isolation='process' is for"):
        django_pgjobs.job("tests.lifecycle.async_process", isolation="process")(handler)


# --- timeouts ----------------------------------------------------------------------------------


def attempts_of(job_id: int) -> list[tuple[str, str]]:
    return [(a.outcome, a.failure_class) for a in ended_attempts(job_id)]


@pytest.mark.slow
@transactional
@pytest.mark.parametrize("task", ["chaos.forever", "chaos.forever_process"])
def test_a_handler_that_loops_forever_is_settled_at_its_timeout(start_worker, task) -> None:
    stuck = django_pgjobs.enqueue(task, {}, priority=10)
    after = django_pgjobs.enqueue("chaos.tick", {})
    worker = start_worker("--poll-interval", "0.1")
    wait_for(lambda: Job.objects.get(pk=stuck.pk).status == JobStatus.DEAD, 60)
    stored = Job.objects.get(pk=stuck.pk)
    assert (stored.failure_class, stored.terminal_reason, stored.attempts) == (
        FailureClass.TIMEOUT, TerminalReason.ATTEMPTS_EXHAUSTED, 2)
    assert "timed out: still running after" in stored.last_error
    assert attempts_of(stuck.pk) == [(AttemptOutcome.TIMED_OUT, FailureClass.TIMEOUT)] * 2
    # The worker went on: a killed child is replaced, an abandoned thread left behind.
    wait_for(lambda: Job.objects.get(pk=after.pk).status == JobStatus.SUCCEEDED, 60)
    worker.signal(signal.SIGTERM)
    assert worker.wait(60) in (0, 1), worker.output()
    if task == "chaos.forever_process":
        # Each attempt ran in a child process the worker killed, not in the worker itself. The
        # timeout counts from the handover, a fresh child's start-up included: on a busy machine
        # an attempt can be killed before its handler wrote its run (even both), never run in
        # the worker.
        pids = set(Run.objects.filter(job_id=stuck.pk).values_list("pid", flat=True))
        assert len(pids) <= 2 and worker.pid not in pids


@pytest.mark.slow
@transactional
def test_jobs_batched_behind_a_timed_out_thread_go_back_at_once(start_worker) -> None:
    stuck = django_pgjobs.enqueue("chaos.forever", {}, priority=10)
    # A long lease: without the hand-back it would wait behind the thread for about a minute.
    behind = django_pgjobs.enqueue("chaos.tick", {}, lease=timedelta(seconds=120))
    worker = start_worker("--concurrency", "1", "--batch-size", "2", "--poll-interval", "0.1")
    wait_for(lambda: Attempt.objects.filter(job_id=behind.pk).exists(), 30)
    assert Attempt.objects.filter(job_id=stuck.pk).count() == 1  # claimed in the same batch
    wait_for(lambda: Attempt.objects.filter(job_id=behind.pk,
                                            outcome=AttemptOutcome.RELEASED).exists(), 20)
    released = Attempt.objects.get(job_id=behind.pk, outcome=AttemptOutcome.RELEASED)
    assert "taken over" in released.error
    # Run later, once the worker gives up on the thread and starts a fresh executor.
    wait_for(lambda: Job.objects.get(pk=behind.pk).status == JobStatus.SUCCEEDED, 60)
    worker.signal(signal.SIGTERM)
    assert worker.wait(60) in (0, 1), worker.output()


@pytest.mark.slow
@transactional
def test_what_a_handler_reports_after_its_timeout_is_kept_beside_the_timeout(
        start_worker) -> None:
    job = django_pgjobs.enqueue("chaos.late_after_timeout", {})
    worker = start_worker("--poll-interval", "0.1")
    wait_for(lambda: Effect.objects.filter(key__startswith="saw_timeout:").exists(), 60)
    wait_for(lambda: Attempt.objects.filter(
        job_id=job.pk, reported_outcome=AttemptOutcome.SUCCEEDED).exists(), 30)
    worker.signal(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.output()
    stored = Job.objects.get(pk=job.pk)
    assert (stored.status, stored.failure_class, stored.result) == (
        JobStatus.DEAD, FailureClass.TIMEOUT, None)
    # The attempt's history is the timeout; the handler's late success is recorded beside it.
    attempt = Attempt.objects.get(job_id=job.pk)
    assert (attempt.outcome, attempt.reported_outcome, attempt.failure_class) == (
        AttemptOutcome.TIMED_OUT, AttemptOutcome.SUCCEEDED, FailureClass.TIMEOUT)
    assert attempt.error.startswith("timed out: still running after")


@django_pgjobs.job("tests.lifecycle.heartbeats_past_timeout", lease=timedelta(seconds=30),
                   timeout=0.3, max_attempts=3)
def heartbeats_past_timeout(ctx: Any, payload: Any) -> str:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            ctx.heartbeat()
        except TimedOut:
            seen.append(("timed_out", ctx.timed_out))
            raise
        time.sleep(0.05)
    return "never"


@django_pgjobs.job("tests.lifecycle.permanent_timeout", timeout=0.3, max_attempts=5,
                   permanent_on=[TimedOut])
def permanent_timeout(ctx: Any, payload: Any) -> None:
    while not ctx.timed_out:
        time.sleep(0.02)


seen: list[tuple[str, Any]] = []


@transactional
def test_after_its_timeout_a_heartbeat_raises_timed_out_and_the_job_retries() -> None:
    seen.clear()
    job = django_pgjobs.enqueue("tests.lifecycle.heartbeats_past_timeout", {})
    worker = Worker(install_signals=False, poll_interval=0.05, max_jobs=1)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    wait_for(lambda: Job.objects.get(pk=job.pk).status == JobStatus.RETRYING, 30)
    wait_for(lambda: seen, 10)
    worker.stop()
    thread.join(30)
    assert seen == [("timed_out", True)]
    stored = Job.objects.get(pk=job.pk)
    assert (stored.failure_class, stored.attempts) == (FailureClass.TIMEOUT, 1)


@transactional
def test_a_timeout_listed_in_permanent_on_is_dead_at_once() -> None:
    job = django_pgjobs.enqueue("tests.lifecycle.permanent_timeout", {})
    Worker(install_signals=False, poll_interval=0.05, max_jobs=1, burst=True).run()
    wait_for(lambda: Job.objects.get(pk=job.pk).status == JobStatus.DEAD, 30)
    stored = Job.objects.get(pk=job.pk)
    assert (stored.failure_class, stored.terminal_reason) == (
        FailureClass.TIMEOUT, TerminalReason.PERMANENT_ERROR)


@pytest.mark.django_db
def test_a_job_timeout_overrides_the_handlers() -> None:
    django_pgjobs.enqueue("tests.lifecycle.permanent_timeout", {}, timeout=7.5)
    [claimed] = claim_jobs("w", "default", 1)
    assert claimed.timeout_seconds == 7.5


# --- cancellation ------------------------------------------------------------------------------


def holding(task: str) -> bool:
    return Run.objects.filter(task=task, stage=Run.Stage.HOLDING).exists()


@pytest.mark.slow
@transactional
@pytest.mark.parametrize("task", ["chaos.until_cancelled", "chaos.cancel_heartbeat",
                                  "chaos.cancel_process", "chaos.cancel_async"])
def test_a_cancel_reaches_a_running_handler_and_the_job_ends_cancelled(start_worker, task):
    job = django_pgjobs.enqueue(task, {})
    worker = start_worker("--poll-interval", "0.1")
    wait_for(lambda: holding(task), 60)
    asked_at = time.monotonic()
    assert cancel_jobs([job.pk]) == (0, 1)
    try:
        wait_for(lambda: Job.objects.get(pk=job.pk).status == JobStatus.CANCELLED, 30, 0.01)
    except AssertionError:
        raise AssertionError(
            f"{Job.objects.get(pk=job.pk).last_error}\n{worker.output()}") from None
    latency = time.monotonic() - asked_at
    print(f"{task}: cancelled {latency:.2f}s after the request")
    if task != "chaos.cancel_process":  # a killed child sees nothing
        wait_for(lambda: Effect.objects.filter(key__startswith="saw_cancel:").exists(), 30)
    time.sleep(1.0)  # whatever the handler does next
    worker.signal(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.output()
    stored = Job.objects.get(pk=job.pk)
    assert (stored.status, stored.terminal_reason, stored.attempts) == (
        JobStatus.CANCELLED, TerminalReason.OPERATOR, 1)
    outcomes = [o for o, _ in attempts_of(job.pk)]
    assert len(outcomes) == 1 and outcomes[0] in (AttemptOutcome.CANCELLED, AttemptOutcome.LOST)


@pytest.mark.django_db
def test_a_cancelled_job_whose_worker_is_gone_is_cancelled_by_the_rescue() -> None:
    job = django_pgjobs.enqueue("tests.ok", {})
    claim_jobs("gone", "default", 1)
    cancel_jobs([job.pk])
    Job.objects.filter(pk=job.pk).update(lease_expires_at=Now() - timedelta(seconds=1))
    [outcome] = rescue_expired_leases(10)
    assert outcome.attempt_outcome == AttemptOutcome.CANCELLED
    stored = Job.objects.get(pk=job.pk)
    assert (stored.status, stored.terminal_reason) == (JobStatus.CANCELLED,
                                                       TerminalReason.OPERATOR)


@pytest.mark.django_db
def test_a_heartbeat_after_a_cancel_raises_cancelled() -> None:
    job = django_pgjobs.enqueue("tests.ok", {})
    [claimed] = claim_jobs("w", "default", 1)
    ctx = JobContext(claimed, worker_id="w", using="default")
    ctx.heartbeat()
    cancel_jobs([job.pk])
    with pytest.raises(Cancelled):
        ctx.heartbeat()
    assert ctx.cancelled and ctx.cancel_requested


# --- paused queues -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_paused_queue_gives_no_claim_and_enqueue_still_works() -> None:
    django_pgjobs.enqueue("tests.ok", {}, queue="mail")
    assert pause_queue("mail", reason="provider down") is True
    assert pause_queue("mail") is False  # already paused
    django_pgjobs.enqueue("tests.ok", {}, queue="mail")
    assert claim_jobs("w", "mail", 10) == []
    assert "mail" not in ready_queues()
    assert resume_queue("mail") is True
    assert len(claim_jobs("w", "mail", 10)) == 2
    kinds = list(OperatorAction.objects.order_by("id").values_list("action", "changed"))
    assert kinds == [("pause_queue", 1), ("pause_queue", 0), ("resume_queue", 1)]


@pytest.mark.django_db
def test_pausing_a_queue_name_outside_the_rule_is_refused() -> None:
    with pytest.raises(ValueError, match="queue must be a queue name"):
        pause_queue("a b")
    assert QueueState.objects.count() == 0


@pytest.mark.slow
@transactional
@pytest.mark.parametrize("listen", [True, False])
def test_a_worker_stops_claiming_from_a_paused_queue_and_resumes_after(listen) -> None:
    first = django_pgjobs.enqueue("tests.ok", {"n": 1}, queue="mail")
    pause_queue("mail")
    worker = Worker(install_signals=False, poll_interval=0.05, queues=["mail"], listen=listen)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        time.sleep(1.0)
        assert Job.objects.get(pk=first.pk).status == JobStatus.READY
        resume_queue("mail")
        wait_for(lambda: Job.objects.get(pk=first.pk).status == JobStatus.SUCCEEDED, 20)
        pause_queue("mail")
        time.sleep(0.5)  # a claim already under way may still finish
        second = django_pgjobs.enqueue("tests.ok", {"n": 2}, queue="mail")
        time.sleep(1.0)
        assert Job.objects.get(pk=second.pk).status == JobStatus.READY
    finally:
        worker.stop()
        thread.join(30)


@pytest.mark.django_db
def test_the_queue_command_pauses_resumes_and_lists() -> None:
    django_pgjobs.enqueue("tests.ok", {}, queue="mail")
    out = StringIO()
    call_command("pgjobs_queue", "pause", "mail", "--reason", "maintenance", stdout=out)
    assert "queue mail: paused" in out.getvalue()
    listing = StringIO()
    call_command("pgjobs_queue", "list", "--json", stdout=listing)
    import json

    rows = {r["queue"]: r for r in json.loads(listing.getvalue())}
    assert rows["mail"]["paused"] is True and rows["mail"]["ready"] == 1
    assert rows["mail"]["reason"] == "maintenance"
    resumed = StringIO()
    call_command("pgjobs_queue", "resume", "mail", stdout=resumed)
    # A queue that is not paused is "active": "running" is a job's status.
    assert resumed.getvalue() == "queue mail: active\n"
    assert QueueState.objects.get(name="mail").paused is False
    assert str(QueueState.objects.get(name="mail")) == "mail (active)"
    text = StringIO()
    call_command("pgjobs_queue", "list", stdout=text)
    assert text.getvalue().startswith("mail                     active  ready=1 running=0 ")
    audit = list(OperatorAction.objects.order_by("id").values_list("action", "actor_name"))
    assert audit == [("pause_queue", "manage.py pgjobs_queue"),
                     ("resume_queue", "manage.py pgjobs_queue")]


@pytest.mark.django_db
def test_stats_show_paused_queues() -> None:
    from django_pgjobs.stats import queue_stats

    django_pgjobs.enqueue("tests.ok", {}, queue="mail")
    pause_queue("mail")
    django_pgjobs.enqueue("tests.ok", {}, queue="other")
    assert {q.queue: q.paused for q in queue_stats()} == {"mail": True, "other": False}


# --- receipts fenced by the lease --------------------------------------------------------------


@django_pgjobs.job("tests.lifecycle.receipt_after_takeover")
def receipt_after_takeover(ctx: Any, payload: Any) -> Any:
    with ctx.receipt("lifecycle", key=str(ctx.job_id)) as receipt:
        Effect.objects.create(key=f"effect:{ctx.job_id}", receipted=True, job_id=ctx.job_id,
                              attempt=ctx.attempt, worker_id=ctx.worker_id)
        # Meanwhile the lease passes on: the job is rescued and claimed by another attempt.
        with _other() as other:
            other.execute("UPDATE pgjobs_job SET lease_token = gen_random_uuid() WHERE id = %s",
                          [ctx.job_id])
        receipt.result = {"done": True}
    return receipt.result


class _other:
    """A second connection in autocommit, for the 'another attempt took the lease' step."""

    def __enter__(self) -> Any:
        self.connection = connections.create_connection("default")
        self.connection.ensure_connection()
        self.connection.set_autocommit(True)
        return self.connection.cursor()

    def __exit__(self, *exc: Any) -> None:
        self.connection.close()


@transactional
def test_a_receipt_block_whose_lease_passed_on_rolls_back_with_lease_lost() -> None:
    job = django_pgjobs.enqueue("tests.lifecycle.receipt_after_takeover", {})
    [claimed] = claim_jobs("w", "default", 1)
    outcome = execute(claimed, JobContext(claimed, worker_id="w", using="default"))
    assert outcome.failure_class == FailureClass.UNKNOWN
    assert "LeaseLost: job" in outcome.error and "the block was rolled back" in outcome.error
    # Neither the receipt nor the block's own write committed.
    assert IdempotencyReceipt.objects.count() == 0
    assert Effect.objects.filter(job_id=job.pk).count() == 0
    assert issubclass(LeaseLost, django_pgjobs.PgJobsError)


@pytest.mark.slow
@transactional
def test_a_worker_stopped_inside_a_receipt_past_its_lease_commits_nothing(start_worker) -> None:
    job = django_pgjobs.enqueue("chaos.receipt_hold", {"key": "once", "hold_seconds": 1.5})
    stopped = start_worker("--worker-id", "stopped", "--poll-interval", "0.1")
    wait_for(lambda: holding("chaos.receipt_hold"), 60)
    time.sleep(0.3)  # inside the block, its effect written but not committed
    stopped.signal(signal.SIGSTOP)
    try:
        taker = start_worker("--worker-id", "taker", "--poll-interval", "0.1")
        time.sleep(4.0)  # past the 2 s lease: rescued, and the retry waits on the receipt
    finally:
        stopped.signal(signal.SIGCONT)
    wait_for(lambda: Job.objects.get(pk=job.pk).status == JobStatus.SUCCEEDED, 60)
    for worker in (stopped, taker):
        worker.signal(signal.SIGTERM)
        worker.wait(60)
    [(worker_id, number)] = Effect.objects.filter(key="once").values_list("worker_id", "attempt")
    # The stopped attempt's block found its lease gone and committed nothing; the one effect is
    # the receipt's, written by a later attempt while it held the lease. Usually that attempt
    # also won; on a slow host its own lease can run out while it waits for the receipt, and the
    # attempt after it replays the receipt instead.
    assert (worker_id, number) != ("stopped", 1)
    receipt = IdempotencyReceipt.objects.get(scope="chaos-effect", key="once")
    assert receipt.result == {"key": "once", "attempt": number}
    [writer] = [a for a in ended_attempts(job.pk) if a.number == number]
    assert writer.worker_id == worker_id
    assert writer.outcome in (AttemptOutcome.SUCCEEDED, AttemptOutcome.LEASE_EXPIRED,
                              AttemptOutcome.LOST)
    [winner] = [a for a in ended_attempts(job.pk) if a.outcome == AttemptOutcome.SUCCEEDED]
    assert Job.objects.get(pk=job.pk).result == receipt.result
    assert winner.number >= number


# --- a cancel that lands between the claim and the start, or that the handler is told of ----

started: list[tuple[str, int]] = []


@django_pgjobs.job("tests.lifecycle.cancels_the_next", priority=100)
def cancels_the_next(ctx: Any, payload: Any) -> str:
    started.append(("first", ctx.job_id))
    # The operator's cancel of the job waiting behind this one commits while this one runs.
    assert cancel_jobs([payload["next"]]) == (0, 1)
    time.sleep(0.2)  # outlast the executor's word on cancels, without the main loop's read
    return "done"


@django_pgjobs.job("tests.lifecycle.records_its_start")
def records_its_start(ctx: Any, payload: Any) -> str:
    started.append(("next", ctx.job_id))
    return "ran"


def run_worker_until(worker: Worker, done: Any) -> None:
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_for(done, 30)
    finally:
        worker.stop()
        thread.join(30)


@transactional
@override_settings(PGJOBS_CANCEL_CHECK_SECONDS=3600)  # only the start-time check can see it
def test_a_claimed_job_cancelled_before_its_start_never_starts_and_ends_cancelled() -> None:
    started.clear()
    waiting = django_pgjobs.enqueue("tests.lifecycle.records_its_start", {})
    first = django_pgjobs.enqueue("tests.lifecycle.cancels_the_next", {"next": waiting.pk})
    worker = Worker(install_signals=False, poll_interval=0.05, batch_size=2, maintenance=[])
    run_worker_until(worker, lambda: Job.objects.filter(
        pk__in=[first.pk, waiting.pk], status__in=["succeeded", "cancelled"]).count() == 2)
    assert started == [("first", first.pk)]
    job = Job.objects.get(pk=waiting.pk)
    assert (job.status, job.terminal_reason, job.attempts, job.result) == (
        JobStatus.CANCELLED, TerminalReason.OPERATOR, 1, None)
    assert list(Attempt.objects.filter(job_id=waiting.pk).values_list(
        "outcome", "reported_outcome", "error")) == [
        (AttemptOutcome.CANCELLED, AttemptOutcome.CANCELLED,
         "cancelled by an operator before it started")]
    assert Job.objects.get(pk=first.pk).status == JobStatus.SUCCEEDED


@transactional
def test_a_batch_of_fast_jobs_starts_without_asking_about_cancels() -> None:
    django_pgjobs.enqueue_many([JobSpec.of("tests.ok", {"n": n}) for n in range(5)])
    settler = Settler(SettlerConfig(using="default", worker_id="w", batch=10, flush_seconds=60),
                      on_settled=lambda *_: None, on_database_error=lambda: None)
    running = RunningJobs(settler, worker_id="w")
    runner = BatchRunner(settler, running, AsyncRunner(settler, running, concurrency=1,
                                                       worker_id="w", using="default"),
                         worker_id="w", using="default", stopping=lambda: False)
    jobs = claim_jobs("w", "default", 5)
    slot = Slot(0)
    with CaptureQueriesContext(connection) as queries:
        runner.hold(slot, jobs)
        runner.run(slot)
    assert [q["sql"] for q in queries.captured_queries] == []
    assert [o.attempt_outcome for o in settler.pending()] == [AttemptOutcome.SUCCEEDED] * 5


@django_pgjobs.job("tests.lifecycle.stops_when_told", lease=timedelta(seconds=3), heartbeat=True)
def stops_when_told(ctx: Any, payload: Any) -> str:
    started.append(("told", ctx.job_id))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not ctx.cancelled:
        time.sleep(0.02)
    return "stopped" if ctx.cancelled else "never told"


@transactional
@override_settings(PGJOBS_CANCEL_CHECK_SECONDS=3600)  # the heartbeat's answer tells it, alone
def test_a_handler_that_stops_because_it_was_told_of_a_cancel_ends_its_job_cancelled() -> None:
    started.clear()
    job = django_pgjobs.enqueue("tests.lifecycle.stops_when_told", {})
    worker = Worker(install_signals=False, poll_interval=0.05, maintenance=[])
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: ("told", job.pk) in started, 30)
        assert cancel_jobs([job.pk]) == (0, 1)
        wait_for(lambda: Job.objects.get(pk=job.pk).status != JobStatus.RUNNING, 30)
    finally:
        worker.stop()
        thread.join(30)
    stored = Job.objects.get(pk=job.pk)
    assert (stored.status, stored.terminal_reason, stored.result, stored.attempts) == (
        JobStatus.CANCELLED, TerminalReason.OPERATOR, None, 1)
    assert list(Attempt.objects.filter(job_id=job.pk).values_list("outcome", "error")) == [
        (AttemptOutcome.CANCELLED, "cancelled by an operator while it ran; the handler was "
                                   "told and then reported succeeded")]
