from __future__ import annotations

import time
import uuid
from dataclasses import replace
from datetime import timedelta

import pytest
from django.db import DataError, connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import django_pgjobs
from django_pgjobs import JobSpec
from django_pgjobs.models import Attempt, Job
from django_pgjobs.outcomes import Outcome
from django_pgjobs.retry import decide
from django_pgjobs.status import AttemptOutcome, FailureClass, JobStatus, TerminalReason
from django_pgjobs.transitions import (
    cancel_jobs,
    claim_jobs,
    dead_letter_jobs,
    extend_leases,
    promote_due_jobs,
    ready_queues,
    rescue_expired_leases,
    retry_jobs,
    settle,
    settle_and_claim,
)
from tests.conftest import succeeded
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def statements(queries: CaptureQueriesContext) -> list[str]:
    """What was sent, without the savepoints a test's own transaction adds around atomic()."""
    return [q["sql"] for q in queries.captured_queries
            if not q["sql"].startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))]


def expire_lease(job_id: int) -> None:
    Job.objects.filter(pk=job_id).update(lease_expires_at=timezone.now() - timedelta(hours=1))


def test_claim_takes_the_highest_priority_oldest_first_and_holds_them_under_a_lease() -> None:
    low = JobFactory(priority=0)
    high_late = JobFactory(priority=10)
    high_early = JobFactory(priority=10, run_at=timezone.now() - timedelta(minutes=1))
    JobFactory(queue="other", priority=100)
    JobFactory(scheduled=True, priority=100)
    claimed = claim_jobs("w1", "default", 2)
    assert [c.id for c in claimed] == [high_early.id, high_late.id]
    for c in claimed:
        job = Job.objects.get(pk=c.id)
        assert job.status == JobStatus.RUNNING
        assert job.attempts == c.attempt == 1
        assert job.lease_owner == "w1" and job.lease_token == c.lease_token
        assert job.lease_expires_at == c.lease_expires_at
        assert job.started_at is not None
        # The lease comes from the database clock: expiry - lease length == the claim's now().
        assert job.lease_expires_at - timedelta(seconds=job.lease_seconds) == job.heartbeat_at
        # The running attempt's record is its job; its own row is written when it ends.
        # claimed_at is the clock as the row was taken, within the claim's statement.
        assert job.heartbeat_at <= job.claimed_at < job.lease_expires_at
        assert c.lease_owner == "w1"
        assert not Attempt.objects.filter(lease_token=c.lease_token).exists()
    assert Job.objects.get(pk=low.pk).status == JobStatus.READY


def test_claim_is_one_statement_in_a_short_transaction() -> None:
    JobFactory.create_batch(10)
    claim_jobs("warmup", "default", 5)  # compile and cache the statement
    with CaptureQueriesContext(connection) as queries:
        claimed = claim_jobs("w1", "default", 5)
    assert len(claimed) == 5
    # One message, the EXECUTE alone: the rest of what was sent is the test transaction's
    # savepoint around the claim's atomic block.
    [sent] = statements(queries)
    # Prepared on first use: the ORM's select_for_update(skip_locked=True) is in the text the
    # session holds, and every later claim sends only its name and its values.
    assert sent.startswith("EXECUTE pgjobs_claim5_") and "'w1'" in sent
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements WHERE name = %s",
                       [sent.split("(")[0].removeprefix("EXECUTE ")])
        [(text,)] = cursor.fetchall()
    assert "FOR UPDATE SKIP LOCKED" in text and '"pgjobs_job"."status" = \'ready\'' in text


@override_settings(PGJOBS_PREPARED_STATEMENTS=False)
def test_claim_sent_in_full_where_statements_are_not_prepared() -> None:
    JobFactory.create_batch(3)
    with CaptureQueriesContext(connection) as queries:
        claimed = claim_jobs("w1", "default", 5)
    assert len(claimed) == 3
    sql = " ".join(q["sql"] for q in queries.captured_queries)
    assert "FOR UPDATE SKIP LOCKED" in sql and "PREPARE" not in sql and "EXECUTE" not in sql


def test_claim_skips_a_row_locked_by_another_connection(other_connection) -> None:
    first, second = JobFactory(priority=5), JobFactory(priority=1)
    other_connection.set_autocommit(False)
    with other_connection.cursor() as cursor:
        cursor.execute("SELECT id FROM pgjobs_job WHERE id = %s FOR UPDATE", [first.id])
    try:
        claimed = claim_jobs("w1", "default", 10)
        assert [c.id for c in claimed] == [second.id]
    finally:
        other_connection.rollback()
        other_connection.set_autocommit(True)
    assert [c.id for c in claim_jobs("w2", "default", 10)] == [first.id]


def test_settle_applies_under_the_lease_in_one_statement() -> None:
    JobFactory.create_batch(3)
    claimed = claim_jobs("w1", "default", 3)
    outcomes = [succeeded(c) for c in claimed]
    with CaptureQueriesContext(connection) as queries:
        won = settle(outcomes)
    assert len(queries.captured_queries) == 1
    assert all(won.values()) and len(won) == 3
    for c in claimed:
        job = Job.objects.get(pk=c.id)
        assert (job.status, job.lease_token, job.lease_owner, job.lease_expires_at) == (
            JobStatus.SUCCEEDED, None, "w1", None)
        assert job.result == {"ok": True} and job.finished_at is not None
        assert job.duration_ms == 1
    assert not Attempt.objects.exists()


def test_inside_a_long_transaction_settle_and_heartbeat_use_the_statements_clock() -> None:
    # This test runs in one transaction, as a TestCase does: now() stays at its start.
    JobFactory.create_batch(2)
    time.sleep(0.01)
    first, second = claim_jobs("w1", "default", 2)
    time.sleep(0.01)
    extended = extend_leases([(second.id, second.lease_token)])
    assert list(extended) == [second.id]
    assert Job.objects.get(pk=second.id).lease_expires_at > second.lease_expires_at
    assert settle([succeeded(first)]) == {first.lease_token: True}
    job = Job.objects.get(pk=first.id)
    attempt = job.success_attempt()
    assert attempt is not None and not Attempt.objects.exists()
    assert job.finished_at is not None and attempt.finished_at is not None
    assert job.finished_at > job.started_at and attempt.finished_at > attempt.claimed_at


def test_a_stale_worker_cannot_settle_or_heartbeat_a_job_another_attempt_owns() -> None:
    JobFactory()
    [stale] = claim_jobs("stale-worker", "default", 1)
    expire_lease(stale.id)
    [rescued] = rescue_expired_leases(10)
    assert rescued.status == JobStatus.RETRYING
    Job.objects.filter(pk=stale.id).update(run_at=timezone.now() - timedelta(hours=1))
    promote_due_jobs(10)
    [fresh] = claim_jobs("fresh-worker", "default", 1)
    assert fresh.id == stale.id and fresh.lease_token != stale.lease_token

    assert extend_leases([(stale.id, stale.lease_token)]) == {}
    won = settle([succeeded(stale)])
    assert won == {stale.lease_token: False}

    job = Job.objects.get(pk=stale.id)
    assert (job.status, job.lease_owner, job.lease_token) == (
        JobStatus.RUNNING, "fresh-worker", fresh.lease_token)
    assert job.attempts == 2
    # The rescue's record of the attempt stands; the late report is kept beside it.
    stale_attempt = Attempt.objects.get(lease_token=stale.lease_token)
    assert (stale_attempt.outcome, stale_attempt.reported_outcome,
            stale_attempt.failure_class) == (
        AttemptOutcome.LEASE_EXPIRED, AttemptOutcome.SUCCEEDED, FailureClass.LEASE_EXPIRED)
    # The fresh owner still settles normally.
    assert settle([succeeded(fresh)]) == {fresh.lease_token: True}
    assert Job.objects.get(pk=stale.id).status == JobStatus.SUCCEEDED


def test_settle_with_a_made_up_token_leaves_the_job_alone_and_records_the_report_lost() -> None:
    JobFactory()
    [c] = claim_jobs("w1", "default", 1)
    forged = uuid.uuid4()
    assert settle([succeeded(c, token=forged)]) == {forged: False}
    job = Job.objects.get(pk=c.id)
    assert (job.status, job.lease_token, job.attempts) == (JobStatus.RUNNING, c.lease_token, 1)
    assert list(Attempt.objects.values_list("lease_token", "outcome", "reported_outcome")) == [
        (forged, AttemptOutcome.LOST, AttemptOutcome.SUCCEEDED)]
    # A report about a job that is gone has nothing to be recorded against.
    gone = replace(succeeded(c, token=uuid.uuid4()), job_id=c.id + 1000)
    assert settle([gone]) == {gone.lease_token: False}
    assert Attempt.objects.count() == 1


def test_a_settlement_rides_with_the_next_claim_in_one_message_and_one_transaction() -> None:
    JobFactory.create_batch(4)
    held = claim_jobs("w1", "default", 2)
    claim_jobs("warmup", "default", 1)  # compile and cache the claim's text
    with CaptureQueriesContext(connection) as queries:
        applied, claimed = settle_and_claim([succeeded(c) for c in held],
                                            "w1", "default", 5)
    assert applied == {c.lease_token: True for c in held}
    assert len(claimed) == 1 and claimed[0].lease_owner == "w1"
    assert len(statements(queries)) == 1  # the settle and the claim, one message
    assert {j.status for j in Job.objects.filter(pk__in=[c.id for c in held])} == {
        JobStatus.SUCCEEDED}
    assert [j.success_attempt() is not None
            for j in Job.objects.filter(pk__in=[c.id for c in held])] == [True, True]


@pytest.mark.django_db(transaction=True)
def test_a_settlement_that_cannot_be_stored_fails_its_claim_too_and_changes_nothing() -> None:
    JobFactory.create_batch(3)
    [held] = claim_jobs("w1", "default", 1)
    bad = replace(succeeded(held), error="a NUL \x00 cannot be stored")
    with pytest.raises(DataError):
        settle_and_claim([bad], "w1", "default", 5)
    assert Job.objects.get(pk=held.id).status == JobStatus.RUNNING
    assert Job.objects.filter(status=JobStatus.READY).count() == 2
    assert not Attempt.objects.exists()


def test_with_server_side_binding_the_settlement_and_claim_are_two_statements() -> None:
    from django.db.backends.postgresql.base import ServerBindingCursor

    JobFactory.create_batch(3)
    [held] = claim_jobs("w1", "default", 1)
    connection.ensure_connection()
    raw = connection.connection
    factory, raw.cursor_factory = raw.cursor_factory, ServerBindingCursor
    try:
        with CaptureQueriesContext(connection) as queries:
            applied, claimed = settle_and_claim([succeeded(held)],
                                                "w1", "default", 5)
    finally:
        raw.cursor_factory = factory
    assert applied == {held.lease_token: True} and len(claimed) == 2
    # The settlement and the claim; and, as this test's transaction goes on after them, the
    # statement that ends what the settlement hands the claim.
    sent = statements(queries)
    assert len(sent) == 3 and "pgjobs_claim_to(NULL, NULL)" in sent[2]


def test_settle_writes_the_attempt_row_once_with_the_claims_facts() -> None:
    JobFactory(max_attempts=3)
    [c] = claim_jobs("w1", "default", 1)
    claimed_at = Job.objects.get(pk=c.id).claimed_at
    failure = _failed(c, FailureClass.TRANSIENT, "boom")
    assert settle([failure]) == {c.lease_token: True}
    attempt = Attempt.objects.get()
    assert (attempt.job_id, attempt.number, attempt.worker_id, attempt.claimed_at,
            attempt.outcome) == (c.id, 1, "w1", claimed_at, AttemptOutcome.FAILED)
    # Sent again (its reply was lost after the commit): nothing changes, and it is not applied.
    assert settle([failure]) == {c.lease_token: False}
    assert Attempt.objects.get().outcome == AttemptOutcome.FAILED
    assert Job.objects.get(pk=c.id).status == JobStatus.RETRYING
    with pytest.raises(ValueError, match="reports one lease twice"):
        settle([succeeded(c), succeeded(c)])


def test_settle_completes_a_running_attempt_row_an_earlier_version_wrote_at_claim() -> None:
    JobFactory.create_batch(2)
    first, second = claim_jobs("w1", "default", 2)
    for c in (first, second):
        Attempt.objects.create(job_id=c.id, number=1, worker_id="w1", lease_token=c.lease_token,
                               outcome=AttemptOutcome.RUNNING)
    expire_lease(second.id)
    rescue_expired_leases(10)
    assert settle([_failed(first, FailureClass.TRANSIENT, "boom"),
                   succeeded(second)]) == {
        first.lease_token: True, second.lease_token: False}
    outcomes = dict(Attempt.objects.values_list("lease_token", "outcome"))
    assert outcomes == {first.lease_token: AttemptOutcome.FAILED,
                        second.lease_token: AttemptOutcome.LEASE_EXPIRED}
    assert Attempt.objects.count() == 2


def attempt_rows_inserted() -> int:
    """Rows inserted into pgjobs_attempt so far in this transaction, by the server's count."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_get_xact_tuples_inserted('pgjobs_attempt'::regclass)")
        return cursor.fetchone()[0]


def test_a_success_writes_no_attempt_row_and_its_job_keeps_the_attempt() -> None:
    JobFactory.create_batch(2, max_attempts=3)
    won, failed = claim_jobs("w1", "default", 2)
    claimed_at = Job.objects.get(pk=won.id).claimed_at
    before = attempt_rows_inserted()
    assert settle([replace(succeeded(won), duration_ms=42),
                   _failed(failed, FailureClass.TRANSIENT, "boom")]) == {
        won.lease_token: True, failed.lease_token: True}
    # One row written, the failure's: the success is kept on its job.
    assert attempt_rows_inserted() - before == 1
    assert list(Attempt.objects.values_list("job_id", "outcome")) == [
        (failed.id, AttemptOutcome.FAILED)]
    job = Job.objects.get(pk=won.id)
    assert (job.status, job.lease_owner, job.lease_token, job.claimed_at, job.duration_ms) == (
        JobStatus.SUCCEEDED, "w1", None, claimed_at, 42)
    attempt = job.success_attempt()
    assert attempt is not None and attempt.pk is None
    assert (attempt.job_id, attempt.number, attempt.worker_id, attempt.claimed_at,
            attempt.finished_at, attempt.outcome, attempt.reported_outcome,
            attempt.duration_ms) == (won.id, 1, "w1", claimed_at, job.finished_at,
                                     AttemptOutcome.SUCCEEDED, AttemptOutcome.SUCCEEDED, 42)
    # Sent again (its reply was lost after the commit): not applied, and no row is written.
    assert settle([replace(succeeded(won), duration_ms=42)]) == {won.lease_token: False}
    assert not Attempt.objects.filter(job_id=won.id).exists()
    # A job that has not succeeded keeps no worker and no success.
    retrying = Job.objects.get(pk=failed.id)
    assert (retrying.status, retrying.lease_owner, retrying.duration_ms) == (
        JobStatus.RETRYING, None, None)
    assert retrying.success_attempt() is None


def test_a_success_after_a_failure_is_the_second_attempt_kept_on_its_job() -> None:
    JobFactory(max_attempts=3)
    [first] = claim_jobs("w1", "default", 1)
    settle([_failed(first, FailureClass.TRANSIENT, "boom")])
    Job.objects.filter(pk=first.id).update(status=JobStatus.READY)
    [second] = claim_jobs("w2", "default", 1)
    assert settle([succeeded(second)]) == {second.lease_token: True}
    job = Job.objects.get(pk=first.id)
    attempt = job.success_attempt()
    assert attempt is not None
    assert (attempt.number, attempt.worker_id, attempt.outcome) == (
        2, "w2", AttemptOutcome.SUCCEEDED)
    assert list(Attempt.objects.values_list("number", "worker_id", "outcome")) == [
        (1, "w1", AttemptOutcome.FAILED)]


def test_heartbeat_extends_only_the_current_lease_and_reports_cancel_requests() -> None:
    JobFactory(lease_seconds=60)
    [c] = claim_jobs("w1", "default", 1)
    Job.objects.filter(pk=c.id).update(lease_expires_at=timezone.now() + timedelta(seconds=1))
    assert extend_leases([(c.id, c.lease_token)]) == {c.id: False}
    extended = Job.objects.get(pk=c.id).lease_expires_at
    assert extended > timezone.now() + timedelta(seconds=50)
    assert cancel_jobs([c.id]) == (0, 1)
    assert extend_leases([(c.id, c.lease_token)]) == {c.id: True}


def job_table_reads() -> tuple[int, int]:
    """Sequential scans of the job table, and scans of its lease index, in this transaction."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_get_xact_numscans('pgjobs_job'::regclass), "
                       "pg_stat_get_xact_numscans('pgjobs_job_lease_idx'::regclass)")
        seq, lease_index = cursor.fetchone()
        return int(seq), int(lease_index)


def test_a_settlement_and_a_heartbeat_find_their_jobs_by_id_not_among_every_running_job() -> None:
    # 500 running jobs among 5,000. Read through the lease index and hashed, as a planner may
    # choose for a statement that also says "running", or read whole for a join it guesses
    # a hundred reports for, every settlement would read all of them, and every attempt
    # since a snapshot still held open (their entries and row versions stay).
    django_pgjobs.enqueue_many([JobSpec.of("tests.ok", {}) for _ in range(5000)])
    claimed = claim_jobs("w1", "default", 500)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE pgjobs_job")
        cursor.execute("DISCARD PLANS")
    before = job_table_reads()
    assert extend_leases([(c.id, c.lease_token) for c in claimed[:10]]) == {
        c.id: False for c in claimed[:10]}
    assert settle([succeeded(c) for c in claimed[:10]]) == {
        c.lease_token: True for c in claimed[:10]}
    assert job_table_reads() == before
    # The token still fences both: a finished job's, and a token that is not the job's.
    assert settle([succeeded(claimed[0])]) == {claimed[0].lease_token: False}
    stranger = replace(claimed[10], lease_token=uuid.uuid4())
    assert extend_leases([(stranger.id, stranger.lease_token)]) == {}
    assert settle([succeeded(stranger)]) == {stranger.lease_token: False}
    assert Job.objects.get(pk=stranger.id).status == JobStatus.RUNNING


def test_rescue_retries_an_expired_lease_with_backoff_and_records_the_attempt() -> None:
    JobFactory(max_attempts=3)
    [c] = claim_jobs("dead-worker", "default", 1)
    expire_lease(c.id)
    JobFactory(running=True)  # a live lease is left alone
    rescued = rescue_expired_leases(10)
    assert [r.job_id for r in rescued] == [c.id]
    job = Job.objects.get(pk=c.id)
    assert job.status == JobStatus.RETRYING
    assert job.failure_class == FailureClass.LEASE_EXPIRED
    assert job.lease_token is None and job.attempts == 1
    assert job.run_at >= job.updated_at
    assert "dead-worker" in job.last_error
    attempt = Attempt.objects.get(lease_token=c.lease_token)
    assert attempt.outcome == AttemptOutcome.LEASE_EXPIRED
    assert Job.objects.filter(status=JobStatus.RUNNING).count() == 1


def test_rescue_ends_a_job_that_used_its_last_attempt() -> None:
    JobFactory(max_attempts=1)
    [c] = claim_jobs("w1", "default", 1)
    expire_lease(c.id)
    rescue_expired_leases(10)
    job = Job.objects.get(pk=c.id)
    assert (job.status, job.terminal_reason) == (JobStatus.DEAD, TerminalReason.ATTEMPTS_EXHAUSTED)
    assert job.finished_at is not None


def test_rescue_ends_a_job_past_its_deadline() -> None:
    JobFactory(max_attempts=10, deadline=timezone.now() + timedelta(seconds=1))
    [c] = claim_jobs("w1", "default", 1)
    Job.objects.filter(pk=c.id).update(
        deadline=timezone.now() - timedelta(hours=1),
        lease_expires_at=timezone.now() - timedelta(hours=1),
    )
    rescue_expired_leases(10)
    job = Job.objects.get(pk=c.id)
    assert (job.status, job.terminal_reason) == (JobStatus.DEAD, TerminalReason.DEADLINE_PASSED)


def test_rescue_is_bounded_by_its_limit() -> None:
    JobFactory.create_batch(5)
    for c in claim_jobs("w1", "default", 5):
        expire_lease(c.id)
    assert len(rescue_expired_leases(2)) == 2
    assert Job.objects.filter(status=JobStatus.RUNNING).count() == 3


def test_promote_makes_due_jobs_ready_and_leaves_future_ones() -> None:
    due = JobFactory(scheduled=True, run_at=timezone.now() - timedelta(seconds=1), queue="q1")
    retry_due = JobFactory(retrying=True, run_at=timezone.now() - timedelta(seconds=1), queue="q2")
    future = JobFactory(scheduled=True)
    assert sorted(promote_due_jobs(100)) == ["q1", "q2"]
    assert Job.objects.get(pk=due.pk).status == JobStatus.READY
    assert Job.objects.get(pk=retry_due.pk).status == JobStatus.READY
    assert Job.objects.get(pk=future.pk).status == JobStatus.SCHEDULED
    assert ready_queues() == ["q1", "q2"]


def test_release_hands_a_job_back_without_using_an_attempt() -> None:
    JobFactory()
    [c] = claim_jobs("w1", "default", 1)
    assert settle([Outcome.released(c, "worker stopping")]) == {c.lease_token: True}
    job = Job.objects.get(pk=c.id)
    assert (job.status, job.attempts, job.lease_token) == (JobStatus.READY, 0, None)
    assert Attempt.objects.get(lease_token=c.lease_token).outcome == AttemptOutcome.RELEASED


def test_operator_transitions_are_guarded_by_state() -> None:
    dead = JobFactory(dead=True)
    ready = JobFactory()
    running = JobFactory(running=True)
    done = JobFactory(succeeded=True)
    assert retry_jobs([dead.pk, ready.pk, running.pk, done.pk]) == 1
    dead.refresh_from_db()
    assert (dead.status, dead.attempts, dead.terminal_reason) == (JobStatus.READY, 0, "")
    assert cancel_jobs([ready.pk, running.pk, done.pk]) == (1, 1)
    assert Job.objects.get(pk=ready.pk).status == JobStatus.CANCELLED
    assert Job.objects.get(pk=running.pk).status == JobStatus.RUNNING
    assert Job.objects.get(pk=running.pk).cancel_requested_at is not None
    assert dead_letter_jobs([dead.pk, running.pk, done.pk], "bad data") == 1
    dead.refresh_from_db()
    assert dead.status == JobStatus.DEAD and "bad data" in dead.last_error
    with pytest.raises(ValueError, match="needs a reason"):
        dead_letter_jobs([dead.pk], " ")


def test_a_running_job_without_a_lease_is_refused_by_the_database() -> None:
    from django.db import IntegrityError, transaction

    job = django_pgjobs.enqueue("tests.ok", {})
    with pytest.raises(IntegrityError, match="pgjobs_job_lease_state"), transaction.atomic():
        Job.objects.filter(pk=job.pk).update(status=JobStatus.RUNNING)
    with pytest.raises(IntegrityError, match="pgjobs_job_priority_range"), transaction.atomic():
        Job.objects.filter(pk=job.pk).update(priority=500)


@pytest.mark.parametrize(("outcome", "status"), [
    (AttemptOutcome.RELEASED, JobStatus.DEAD),
    (AttemptOutcome.SUCCEEDED, JobStatus.READY),
    (AttemptOutcome.FAILED, JobStatus.SUCCEEDED),
    (AttemptOutcome.LOST, JobStatus.READY),
    (AttemptOutcome.RUNNING, JobStatus.RUNNING),
    (AttemptOutcome.SNOOZED, JobStatus.CANCELLED),
])
def test_settle_refuses_an_outcome_that_is_not_a_way_out_of_running(outcome, status) -> None:
    JobFactory()
    [c] = claim_jobs("w1", "default", 1)
    forged = replace(Outcome.released(c, "x"), attempt_outcome=outcome, status=status)
    with CaptureQueriesContext(connection) as queries, pytest.raises(
        ValueError, match=f"attempt outcome '{outcome.value}' cannot send a running job to "
                          f"'{status.value}'"):
        settle([Outcome.succeeded(c, "null", 1), forged])
    assert queries.captured_queries == []  # refused before anything was sent
    assert Job.objects.get(pk=c.id).status == JobStatus.RUNNING


def test_every_named_constructor_builds_a_way_out_of_running() -> None:
    from django_pgjobs.outcomes import WAYS_OUT
    from django_pgjobs.retry import Decision

    JobFactory()
    [c] = claim_jobs("w1", "default", 1)
    built = [
        Outcome.succeeded(c, "null", 1),
        Outcome.failed(c, FailureClass.TRANSIENT,
                       Decision(JobStatus.RETRYING, 1.0, ""), error="e"),
        Outcome.failed(c, FailureClass.PERMANENT,
                       Decision(JobStatus.DEAD, None, TerminalReason.PERMANENT_ERROR), error="e"),
        Outcome.failed(c, FailureClass.LEASE_EXPIRED,
                       Decision(JobStatus.RETRYING, 1.0, ""), error="e"),
        Outcome.failed(c, FailureClass.LEASE_EXPIRED,
                       Decision(JobStatus.DEAD, None, TerminalReason.ATTEMPTS_EXHAUSTED),
                       error="e"),
        Outcome.failed(c, FailureClass.TIMEOUT, Decision(JobStatus.RETRYING, 1.0, ""), error="e"),
        Outcome.failed(c, FailureClass.TIMEOUT,
                       Decision(JobStatus.DEAD, None, TerminalReason.ATTEMPTS_EXHAUSTED),
                       error="e"),
        Outcome.cancelled(c, "asked to stop"),
        Outcome.dead(c, TerminalReason.SNOOZE_LIMIT, "e"),
        Outcome.snoozed(c, 5.0, 1),
        Outcome.snoozed(c, 0.0, 1),
        Outcome.released(c, "stopping"),
    ]
    assert [o.problem() for o in built] == [None] * len(built)
    assert {(o.attempt_outcome, o.status) for o in built} == {
        (outcome, status) for outcome, statuses in WAYS_OUT.items() for status in statuses
    }


def test_a_claim_is_read_by_column_names_not_positions() -> None:
    from django_pgjobs.claimed import claimed_jobs

    JobFactory(payload={"n": 1}, priority=3, trace_id="t-1")
    [c] = claim_jobs("w1", "default", 1)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT run_at_us, queue, id, task, payload, payload_version, attempts AS attempt, "
            "max_attempts, snoozes, deadline_us, lease_seconds, lease_token, lease_owner, "
            "lease_expires_at_us, trace_id, priority, created_at_us, timeout_seconds, "
            "scheduled_at_us, traceparent FROM ("
            "SELECT *, (extract(epoch FROM deadline) * 1000000)::int8 AS deadline_us, "
            "(extract(epoch FROM lease_expires_at) * 1000000)::int8 AS lease_expires_at_us, "
            "(extract(epoch FROM created_at) * 1000000)::int8 AS created_at_us, "
            "(extract(epoch FROM run_at) * 1000000)::int8 AS run_at_us, "
            "(extract(epoch FROM scheduled_at) * 1000000)::int8 AS scheduled_at_us "
            "FROM pgjobs_job WHERE id = %s) AS j", [c.id])
        columns = [d.name for d in cursor.description]
        [again] = claimed_jobs(columns, cursor.fetchall())
    fields = ("id", "task", "payload", "attempt", "priority", "trace_id", "queue", "lease_token",
              "lease_owner", "lease_expires_at", "deadline", "created_at", "run_at", "scheduled_at",
              "traceparent")
    assert {f: getattr(again, f) for f in fields} == {f: getattr(c, f) for f in fields}
    with pytest.raises(LookupError, match=r"lacks column\(s\) trace_id$"):
        claimed_jobs([name for name in columns if name != "trace_id"], [])


def _failed(c, failure_class: FailureClass, error: str) -> Outcome:
    decision = decide(failure_class, attempts=c.attempt, max_attempts=c.max_attempts,
                      created_at=c.created_at, deadline=c.deadline, now=timezone.now())
    return Outcome.failed(c, failure_class, decision, error=error)


@pytest.mark.parametrize("takeover", ["timed_out", "lease_expired", "cancelled"])
def test_a_late_report_is_recorded_beside_the_attempts_outcome_never_over_it(takeover) -> None:
    JobFactory(max_attempts=3)
    [c] = claim_jobs("w1", "default", 1)
    if takeover == "timed_out":
        ended = _failed(c, FailureClass.TIMEOUT, "timed out: still running after 2.0s")
        assert settle([ended]) == {c.lease_token: True}
    elif takeover == "lease_expired":
        expire_lease(c.id)
        [ended] = rescue_expired_leases(10)
    else:
        cancel_jobs([c.id])
        ended = Outcome.cancelled(c, "cancelled by an operator while it ran")
        assert settle([ended]) == {c.lease_token: True}
    before = Attempt.objects.values().get(lease_token=c.lease_token)

    late = _failed(c, FailureClass.TRANSIENT, "Transient: lease lost; stopping")
    assert settle([late]) == {c.lease_token: False}
    # Sent again (its reply was lost): still nothing over the attempt's record.
    assert settle([succeeded(c)]) == {c.lease_token: False}

    after = Attempt.objects.values().get(lease_token=c.lease_token)
    assert after == {**before, "reported_outcome": AttemptOutcome.FAILED}
    assert (after["outcome"], after["failure_class"], after["error"]) == (
        ended.attempt_outcome, ended.failure_class, ended.error)
    assert Attempt.objects.count() == 1


def test_a_late_success_of_an_attempt_whose_number_the_same_worker_won_again_is_recorded() -> None:
    # An operator cancels a running job, and its worker ends the attempt in the handler's place;
    # the operator retries it (the count starts again) and the same worker wins attempt 1 anew.
    # The first handler then returns: its late success must be kept beside its cancelled row,
    # not taken for the winning success sent again.
    JobFactory(max_attempts=3)
    [first] = claim_jobs("w1", "default", 1)
    cancel_jobs([first.id])
    assert settle([Outcome.cancelled(first, "cancelled by an operator while it ran")]) == {
        first.lease_token: True}
    assert retry_jobs([first.id]) == 1
    [again] = claim_jobs("w1", "default", 1)
    assert (again.attempt, again.lease_owner) == (first.attempt, first.lease_owner) == (1, "w1")
    assert settle([succeeded(again)]) == {again.lease_token: True}

    assert settle([succeeded(first)]) == {first.lease_token: False}
    row = Attempt.objects.get()
    assert (row.lease_token, row.outcome, row.reported_outcome) == (
        first.lease_token, AttemptOutcome.CANCELLED, AttemptOutcome.SUCCEEDED)
    assert Job.objects.get(pk=first.id).success_attempt() is not None


def test_a_late_report_on_a_job_that_succeeded_before_0018_is_recorded_lost() -> None:
    # A success settled by a worker older than migration 0018 wrote its row and cleared
    # lease_owner; a made-up late report about that job is recorded, not taken for a resend.
    JobFactory()
    [c] = claim_jobs("w1", "default", 1)
    assert settle([succeeded(c)]) == {c.lease_token: True}
    Job.objects.filter(pk=c.id).update(lease_owner=None, duration_ms=None)
    forged = uuid.uuid4()
    assert settle([succeeded(c, token=forged)]) == {forged: False}
    assert list(Attempt.objects.values_list("outcome", flat=True)) == [AttemptOutcome.LOST]


@pytest.mark.parametrize("hand_back", ["released", "snoozed"])
def test_a_hand_back_that_a_pending_cancel_ends_keeps_its_attempts_count(hand_back) -> None:
    JobFactory()
    [c] = claim_jobs("w1", "default", 1)
    assert cancel_jobs([c.id]) == (0, 1)
    outcome = (Outcome.released(c, "worker stopping") if hand_back == "released"
               else Outcome.snoozed(c, 30, duration_ms=3))
    assert settle([outcome]) == {c.lease_token: True}
    job = Job.objects.get(pk=c.id)
    rows = list(Attempt.objects.filter(job_id=c.id).values_list("outcome", "reported_outcome"))
    assert (job.status, job.terminal_reason) == (JobStatus.CANCELLED, TerminalReason.OPERATOR)
    assert rows == [(AttemptOutcome.CANCELLED, hand_back)]
    assert job.attempts == len(rows) == 1


def test_a_release_and_the_next_claim_of_its_job_are_stamped_in_order() -> None:
    # The release and the claim that takes the job again go in one message, as a worker sends
    # them: one statement time for both, so only the clock can order them.
    JobFactory()
    [c] = claim_jobs("w1", "default", 1)
    claim_jobs("warmup", "default", 1)  # compile and cache the claim's text
    applied, [again] = settle_and_claim([Outcome.released(c, "worker stopping")],
                                        "w1", "default", 1)
    assert applied == {c.lease_token: True} and again.id == c.id
    released = Attempt.objects.get(lease_token=c.lease_token)
    job = Job.objects.get(pk=c.id)
    assert released.claimed_at < released.finished_at < job.claimed_at
    assert job.lease_expires_at - timedelta(seconds=job.lease_seconds) == job.heartbeat_at
