"""Per-key concurrency limits: at most max_running jobs of one key ready or running at any
instant, held by the database for every writer, freed by the statement that ends a run."""

from __future__ import annotations

import math
import re
import signal
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext

import django_pgjobs
from django_pgjobs import InvalidJobOption, InvalidLimitKey, Limit, sql
from django_pgjobs.enqueuing import JobSpec
from django_pgjobs.models import Job, KeyLimit, KeySlot, OperatorAction, QueueState
from django_pgjobs.outcomes import Outcome
from django_pgjobs.retry import Decision
from django_pgjobs.status import FailureClass, JobStatus, TerminalReason
from django_pgjobs.transitions import (
    Actor,
    admit_waiting_keys,
    cancel_jobs,
    claim_jobs,
    dead_letter_jobs,
    free_orphaned_slots,
    orphaned_slots_start,
    promote_jobs_due_by,
    rescue_expired_leases,
    retry_jobs,
    set_key_limit,
    settle,
    settle_and_claim,
)
from tests.conftest import ended_attempts, succeeded, wait_for

pytestmark = pytest.mark.django_db


def statuses(*jobs: Job) -> list[str]:
    return [Job.objects.get(pk=j.pk).status for j in jobs]


def held(key: str) -> dict[int, int | None]:
    """The slots of ``key``: slot number -> the job holding it."""
    return dict(KeySlot.objects.filter(key=key).values_list("n", "job_id"))


def enqueue_for(customer: str, n: int, **options: Any) -> list[Job]:
    return [django_pgjobs.enqueue("tests.limited", {"customer": customer, "i": i}, **options)
            for i in range(n)]


# --- declaring a limit ----------------------------------------------------------------------------


@pytest.mark.parametrize(("make", "message"), [
    (lambda: Limit(0), "max_running must be a whole number from 1 to 10000, got 0"),
    (lambda: Limit(-1), "got -1"),
    (lambda: Limit(math.nan), "got nan"),  # type: ignore[arg-type]
    (lambda: Limit(math.inf), "got inf"),  # type: ignore[arg-type]
    (lambda: Limit(True), "got True"),
    (lambda: Limit(2.5), "got 2.5"),  # type: ignore[arg-type]
    (lambda: Limit(10_001), "got 10001"),
    (lambda: Limit(1, key=5), "key must be a function of the payload"),  # type: ignore[arg-type]
    (lambda: Limit(1, key="customer"), "'fairness_key', 'queue' or None, got 'customer'"),
    (lambda: Limit(1, name="two words"), "Limit name must be a task name"),
    (lambda: django_pgjobs.job("tests.not_a_limit", limit=2)(lambda ctx, p: None),
     "limit must be a django_pgjobs.Limit"),
])
def test_a_bad_limit_is_refused_where_it_is_declared(make, message) -> None:
    with pytest.raises(InvalidJobOption, match=message.replace("(", r"\(").replace(")", r"\)")):
        make()


@pytest.mark.parametrize(("payload", "options", "message"), [
    ({}, {}, r"the limit key function raised KeyError: \"'customer'\""),
    ({"customer": 42}, {}, "function must return a string, returned int"),
    ({"customer": "x" * 300}, {}, "must be at most 255 characters"),
    ({"customer": "a\nb"}, {}, "must not contain control characters"),
])
def test_a_key_function_that_fails_is_refused_before_any_sql(payload, options, message) -> None:
    with transaction.atomic():
        with CaptureQueriesContext(connection) as queries, pytest.raises(InvalidLimitKey,
                                                                          match=message):
            django_pgjobs.enqueue("tests.limited_bad_key", payload, **options)
        assert queries.captured_queries == []
        # The caller's transaction goes on: the next enqueue works in it.
        django_pgjobs.enqueue("tests.ok", {})
    assert list(Job.objects.values_list("task", flat=True)) == ["tests.ok"]


def test_a_fairness_key_limit_needs_the_jobs_fairness_key() -> None:
    with pytest.raises(InvalidLimitKey, match="give fairness_key= when enqueueing"):
        django_pgjobs.enqueue("tests.limited_by_fairness_key", {})
    job = django_pgjobs.enqueue("tests.limited_by_fairness_key", {}, fairness_key="acme")
    assert job.limit_key == "tests.limited_by_fairness_key:acme"


# --- at most max_running ready or running ---------------------------------------------------------


def test_jobs_past_a_keys_limit_wait_throttled_and_other_keys_do_not() -> None:
    acme = enqueue_for("acme", 4)
    other = enqueue_for("other", 1)
    assert [j.status for j in acme + other] == ["ready", "ready", "throttled", "throttled",
                                                "ready"]
    assert statuses(*acme, *other) == [j.status for j in acme + other]
    assert held("tests.limited:acme") == {0: acme[0].pk, 1: acme[1].pk}
    assert held("tests.limited:other") == {0: other[0].pk, 1: None}
    claimed = claim_jobs("w", "default", 10)
    assert sorted(c.id for c in claimed) == sorted([acme[0].pk, acme[1].pk, other[0].pk])


def test_a_bulk_enqueue_keeps_the_limit_and_answers_each_jobs_state() -> None:
    jobs = django_pgjobs.enqueue_many([JobSpec.of("tests.limited", {"customer": c})
                                       for c in ("a", "b", "a", "a", "b", "b")])
    assert [j.status for j in jobs] == ["ready", "ready", "ready", "throttled", "ready",
                                        "throttled"]
    assert statuses(*jobs) == [j.status for j in jobs]
    assert [j.limit_key for j in jobs[:2]] == ["tests.limited:a", "tests.limited:b"]


def test_a_limit_without_a_key_caps_the_handler_and_a_shared_name_caps_its_handlers() -> None:
    capped = [django_pgjobs.enqueue("tests.capped", {"i": i}) for i in range(2)]
    shared = [django_pgjobs.enqueue(task, {}) for task in ("tests.shared_a", "tests.shared_b")]
    assert [j.status for j in capped + shared] == ["ready", "throttled", "ready", "throttled"]
    assert {j.limit_key for j in shared} == {"provider:"}


def test_a_limit_keyed_by_queue_caps_each_queue_across_the_handlers_that_share_it() -> None:
    a, b = (django_pgjobs.enqueue(task, {}, queue="default")
            for task in ("tests.capped_per_queue", "tests.capped_per_queue_too"))
    c = django_pgjobs.enqueue("tests.capped_per_queue", {}, queue="other")
    assert (a.limit_key, b.limit_key, c.limit_key) == (
        "per-queue:default", "per-queue:default", "per-queue:other")
    assert statuses(a, b, c) == ["ready", "throttled", "ready"]


def test_the_statement_that_ends_a_run_gives_its_slot_to_the_keys_next_job() -> None:
    first, second = enqueue_for("acme", 2)
    low, high = (django_pgjobs.enqueue("tests.limited", {"customer": "acme"}, priority=p)
                 for p in (0, 5))
    [c1, _] = claim_jobs("w", "default", 10)
    with CaptureQueriesContext(connection) as queries:
        settle([succeeded(c1)])
    assert len([q for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]) == 1
    # The higher priority goes first, as the claim would take it.
    assert statuses(first, second, low, high) == ["succeeded", "running", "throttled", "ready"]
    assert held("tests.limited:acme")[Job.objects.get(pk=high.pk).limit_slot] == high.pk


def job_updates() -> int:
    """Rows of pgjobs_job this transaction has updated so far."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT n_tup_upd FROM pg_stat_xact_user_tables "
                       "WHERE relname = 'pgjobs_job'")
        return int(cursor.fetchone()[0])


def test_a_settlement_sent_with_a_claim_starts_the_keys_next_job_for_that_claim() -> None:
    first, second = enqueue_for("acme", 2)
    low, high = (django_pgjobs.enqueue("tests.limited", {"customer": "acme"}, priority=p)
                 for p in (0, 5))
    other = django_pgjobs.enqueue("tests.ok", {})  # ready, in the same queue
    [c1, c2] = claim_jobs("w", "default", 2)
    before = job_updates()
    applied, claimed = settle_and_claim([succeeded(c1), succeeded(c2)], "w2", "default", 2)
    assert applied == {c1.lease_token: True, c2.lease_token: True}
    # The freed slots went to the key's waiting jobs, highest priority first; they fill the
    # claim's batch of 2, so the ready job of another key waits for the next claim.
    assert [c.id for c in claimed] == [high.pk, low.pk]
    assert statuses(first, second, high, low, other) == [
        "succeeded", "succeeded", "running", "running", "ready"]
    # Each was written once, from throttled to running: two settled, two started.
    assert job_updates() - before == 4
    for c in claimed:
        row = Job.objects.get(pk=c.id)
        assert (row.lease_owner, row.lease_token, row.attempts) == ("w2", c.lease_token, 1)
        assert row.lease_expires_at == row.heartbeat_at + timedelta(seconds=row.lease_seconds)
        assert held("tests.limited:acme")[row.limit_slot] == row.pk
    ended = max(Job.objects.get(pk=j.pk).finished_at for j in (first, second))
    assert min(Job.objects.get(pk=c.id).claimed_at for c in claimed) > ended
    # What was started is run and settled like any claimed job.
    assert settle([succeeded(c) for c in claimed]) == {c.lease_token: True for c in claimed}


def test_jobs_handed_to_a_claim_count_in_its_batch_and_the_rest_are_made_ready() -> None:
    enqueue_for("acme", 2)
    waiting = enqueue_for("acme", 2)
    [c1, c2] = claim_jobs("w", "default", 2)
    _, claimed = settle_and_claim([succeeded(c1), succeeded(c2)], "w", "default", 1)
    assert [c.id for c in claimed] == [waiting[0].pk]
    assert statuses(*waiting) == ["running", "ready"]


def test_a_job_of_another_queue_or_a_paused_one_is_made_ready_not_started() -> None:
    enqueue_for("acme", 1)
    enqueue_for("acme", 1, queue="elsewhere")  # holds the other slot, ready
    later = enqueue_for("acme", 1, queue="elsewhere")[0]
    [c] = claim_jobs("w", "default", 1)
    assert settle_and_claim([succeeded(c)], "w", "default", 5)[1] == []
    assert statuses(later) == ["ready"]

    enqueue_for("beta", 2)
    waiting = enqueue_for("beta", 1)[0]
    [b1, _] = claim_jobs("w", "default", 2)
    QueueState.objects.create(name="default", paused=True)
    assert settle_and_claim([succeeded(b1)], "w", "default", 5)[1] == []
    assert statuses(waiting) == ["ready"]


def test_after_a_settle_and_claim_a_transaction_that_goes_on_starts_nothing_for_it() -> None:
    enqueue_for("acme", 1)
    [elsewhere] = enqueue_for("acme", 1, queue="elsewhere")  # holds the other slot, ready
    waiting = enqueue_for("acme", 2)
    [c] = claim_jobs("w", "default", 1)
    _, claimed = settle_and_claim([succeeded(c)], "w", "default", 5)
    assert [c.id for c in claimed] == [waiting[0].pk]
    # Later in this test's transaction an operator dead-letters the other slot's job: its slot
    # goes to the next job as ready, not started for the claim that came before.
    dead_letter_jobs([elsewhere.pk], "no longer wanted", actor=Actor("op"))
    assert statuses(*waiting) == ["running", "ready"]
    assert Job.objects.get(pk=waiting[1].pk).lease_owner is None


@pytest.mark.django_db(transaction=True)
def test_a_transaction_the_caller_manages_goes_on_after_the_claim_too() -> None:
    enqueue_for("acme", 1)
    [elsewhere] = enqueue_for("acme", 1, queue="elsewhere")
    waiting = enqueue_for("acme", 2)
    [c] = claim_jobs("w", "default", 1)
    transaction.set_autocommit(False)
    try:
        _, claimed = settle_and_claim([succeeded(c)], "w", "default", 5)
        dead_letter_jobs([elsewhere.pk], "no longer wanted", actor=Actor("op"))
        transaction.commit()
    finally:
        transaction.set_autocommit(True)
    assert [c.id for c in claimed] == [waiting[0].pk]
    assert statuses(*waiting) == ["running", "ready"]
    assert unheld_slots() == []


def unheld_slots() -> list[Any]:
    """Held slots whose job does not say it holds them (what the orphaned-slots step frees)."""
    with connection.cursor() as cursor:
        cursor.execute(sql.query("orphaned_slots"), {"after": 0, "until": 10**12, "batch": 100})
        return [row[2:] for row in cursor.fetchall() if row[2] is not None]


@pytest.mark.parametrize("batch", [5, 1])
def test_a_slot_freed_in_a_nested_statement_is_not_handed_to_a_job_twice(batch) -> None:
    # B's end makes its dependent ready in a statement of the workflows' trigger, which runs
    # while the settle statement's own row triggers still run: the slots that statement freed
    # are handed on in two steps, and the second must not pick the job the first handed.
    [a, b] = enqueue_for("acme", 2)
    waiting = enqueue_for("acme", 2)
    dependent = django_pgjobs.enqueue("tests.ok", {}, after=[b])
    running = claim_jobs("w", "default", 2)
    assert {c.id for c in running} == {a.pk, b.pk}
    _, claimed = settle_and_claim([succeeded(c) for c in running], "w", "default", batch)
    if batch == 5:
        assert {c.id for c in claimed} == {waiting[0].pk, waiting[1].pk, dependent.pk}
        assert statuses(*waiting) == ["running", "running"]
    else:
        assert [c.id for c in claimed] == [waiting[0].pk]
        assert statuses(*waiting) == ["running", "ready"]
    assert sorted(held("tests.limited:acme").values()) == sorted(j.pk for j in waiting)
    assert sorted(Job.objects.filter(pk__in=[j.pk for j in waiting])
                  .values_list("limit_slot", flat=True)) == [0, 1]
    assert unheld_slots() == []


def test_an_update_of_thousands_of_slot_holders_hands_each_slot_on() -> None:
    keys = 4000
    django_pgjobs.enqueue_many([JobSpec.of("tests.limited", {"customer": f"c{i}", "n": n})
                                for n in range(3) for i in range(keys)])
    holders = list(Job.objects.filter(status="ready").values_list("pk", flat=True))
    assert len(holders) == 2 * keys
    # One statement ends the runs of half of them: more than the noted list holds at once.
    first = [pk for pk in holders if Job.objects.filter(pk=pk, limit_slot=0).exists()]
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL track_functions = 'all'")
    assert cancel_jobs(first, actor=Actor("op")) == (keys, 0)
    # In batches of 1,024 characters of ids (one or two hundred jobs): the hand-over's cost
    # grows with the square of its batch.
    with connection.cursor() as cursor:
        cursor.execute("SELECT calls FROM pg_stat_xact_user_functions "
                       "WHERE funcname = 'pgjobs_limit_hand_over_many'")
        assert cursor.fetchone()[0] >= keys // 400
    assert Job.objects.filter(status="throttled").count() == 0
    assert Job.objects.filter(status="ready").count() == 2 * keys
    assert unheld_slots() == []


def test_a_hand_over_finds_its_slots_by_key_not_by_reading_every_slot() -> None:
    # 500 keys at their limit: 1,000 slot rows, which a planner left to itself would read
    # whole and hash (a generic plan guesses ten freed slots), at 25 us a row freed.
    django_pgjobs.enqueue_many([JobSpec.of("tests.limited", {"customer": f"c{i}", "n": n})
                                for n in range(3) for i in range(500)])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE pgjobs_key_slot")
        cursor.execute("DISCARD PLANS")  # the hand-over is planned for this table as it is
    claimed = claim_jobs("w", "default", 10)

    def slot_table_reads() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT seq_scan FROM pg_stat_xact_user_tables "
                           "WHERE relname = 'pgjobs_key_slot'")
            return int(cursor.fetchone()[0])

    before = slot_table_reads()
    _, started = settle_and_claim([succeeded(c) for c in claimed], "w", "default", 10)
    assert slot_table_reads() == before
    assert len(started) == 10
    assert unheld_slots() == []


def test_a_settlement_alone_makes_the_next_job_ready() -> None:
    enqueue_for("acme", 2)
    waiting = enqueue_for("acme", 1)[0]
    [c1, _] = claim_jobs("w", "default", 2)
    settle([succeeded(c1)])
    assert statuses(waiting) == ["ready"]


def claimed_one(customer: str = "acme") -> tuple[Any, Job]:
    """A running job of ``customer``, another holding the key's other slot, and one waiting."""
    enqueue_for(customer, 1)
    [c] = claim_jobs("w", "default", 1)
    enqueue_for(customer, 1)  # holds the other slot, and stays ready
    waiting = enqueue_for(customer, 1)[0]
    assert waiting.status == "throttled"
    return c, waiting


def transient(c: Any) -> Outcome:
    return Outcome.failed(c, FailureClass.TRANSIENT, Decision(JobStatus.RETRYING, 30, ""),
                          error="boom")


@pytest.mark.parametrize(("outcome", "status"), [
    (lambda c: Outcome.succeeded(c, "null", 1), "succeeded"),
    (transient, "retrying"),
    (lambda c: Outcome.failed(c, FailureClass.PERMANENT,
                              Decision(JobStatus.DEAD, None, TerminalReason.PERMANENT_ERROR),
                              error="no"), "dead"),
    (lambda c: Outcome.failed(c, FailureClass.TIMEOUT, Decision(JobStatus.RETRYING, 1, ""),
                              error="timed out"), "retrying"),
    (lambda c: Outcome.cancelled(c, "stop"), "cancelled"),
    (lambda c: Outcome.snoozed(c, 60, 1), "scheduled"),
])
def test_every_way_out_of_running_frees_the_slot(outcome, status) -> None:
    c, waiting = claimed_one()
    assert settle([outcome(c)]) == {c.lease_token: True}
    assert statuses(Job(pk=c.id), waiting) == [status, "ready"]


def test_a_job_handed_back_unstarted_keeps_its_slot() -> None:
    c, waiting = claimed_one()
    settle([Outcome.released(c, "worker stopping")])
    assert statuses(Job(pk=c.id), waiting) == ["ready", "throttled"]
    assert c.id in held("tests.limited:acme").values()


def test_a_stale_report_frees_nothing() -> None:
    c, waiting = claimed_one()
    forged = uuid.uuid4()
    assert settle([succeeded(c, token=forged)]) == {forged: False}
    assert statuses(Job(pk=c.id), waiting) == ["running", "throttled"]


def test_a_rescued_lease_frees_the_slot_of_a_worker_that_died() -> None:
    c, waiting = claimed_one()
    Job.objects.filter(pk=c.id).update(lease_expires_at=Now() - timedelta(seconds=1))
    [rescued] = rescue_expired_leases(10)
    assert rescued.job_id == c.id
    assert statuses(Job(pk=c.id), waiting) == ["retrying", "ready"]


def test_operators_cancel_and_dead_letter_free_slots_and_a_retry_waits_for_one() -> None:
    holder, other, waiting = enqueue_for("acme", 3)
    assert cancel_jobs([holder.pk], actor=Actor("op")) == (1, 0)
    assert statuses(holder, other, waiting) == ["cancelled", "ready", "ready"]
    assert dead_letter_jobs([waiting.pk], "stuck", actor=Actor("op")) == 1
    third = enqueue_for("acme", 1)[0]
    assert third.status == "ready"
    # Retried, the cancelled job is due again: it waits for a slot like any other.
    assert retry_jobs([holder.pk], actor=Actor("op")) == 1
    assert statuses(holder, other, third) == ["throttled", "ready", "ready"]


def test_a_retry_promoted_when_due_waits_for_a_slot() -> None:
    c, waiting = claimed_one()
    settle([transient(c)])  # retrying; its slot went to the waiting job
    assert statuses(waiting) == ["ready"]
    promote_jobs_due_by(Job.objects.get(pk=c.id).run_at, 10)
    assert statuses(Job(pk=c.id)) == ["throttled"]


def test_a_duplicate_enqueue_that_a_unique_index_refuses_takes_no_slot() -> None:
    first = django_pgjobs.enqueue("tests.limited", {"customer": "acme"}, idempotency_key="k")
    again = django_pgjobs.enqueue("tests.limited", {"customer": "acme"}, idempotency_key="k")
    assert (first.pk, first.created, again.created) == (again.pk, True, False)
    assert first.status == "throttled"  # keyed: it waited, then took its slot after the insert
    assert statuses(first) == ["ready"]
    assert held("tests.limited:acme") == {0: first.pk, 1: None}
    assert enqueue_for("acme", 2)[1].status == "throttled"


# --- never waiting, never over: other transactions ------------------------------------------------


def insert_capped(cursor: Any) -> tuple[int, str]:
    """Insert a job of tests.capped as enqueue would, on another connection; (id, status)."""
    cursor.execute(
        "INSERT INTO pgjobs_job (task, payload_version, queue, payload, status, priority,"
        " base_priority, attempts, max_attempts, snoozes, lease_seconds, trace_id, failure_class,"
        " terminal_reason, last_error, limit_key, limit_max)"
        " VALUES ('tests.capped', 1, 'default', '{}', 'ready', 0, 0, 0, 3, 0, 60, '', '', '', '',"
        " 'tests.capped:', 1) RETURNING id, status")
    [(job_id, status)] = cursor.fetchall()
    return job_id, status


@pytest.mark.django_db(transaction=True)
def test_a_claim_held_open_elsewhere_leaves_nothing_of_its_key_to_claim(other_connection) -> None:
    django_pgjobs.enqueue("tests.capped", {"i": 1})
    second = django_pgjobs.enqueue("tests.capped", {"i": 2})
    other_connection.set_autocommit(False)
    try:
        with other_connection.cursor() as cursor:
            cursor.execute("SELECT id FROM pgjobs_job WHERE status = 'ready' FOR UPDATE")
        # Another worker's claim has the key's one ready job locked and uncommitted: this one
        # gets nothing of the key, and does not wait.
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '200ms'")
        assert claim_jobs("w2", "default", 10) == []
        third = django_pgjobs.enqueue("tests.capped", {"i": 3})
        assert statuses(second, third) == ["throttled", "throttled"]
    finally:
        other_connection.rollback()
        other_connection.set_autocommit(True)
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")


@pytest.mark.django_db(transaction=True)
def test_an_uncommitted_enqueue_holds_its_slot_and_others_skip_it(other_connection) -> None:
    # The key's slots exist (made by its first enqueue, committed): only a brand-new key's
    # first enqueue makes them, and a concurrent enqueue of that key waits for it.
    cancel_jobs([django_pgjobs.enqueue("tests.capped", {}).pk])
    other_connection.set_autocommit(False)
    try:
        with other_connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '200ms'")
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '200ms'")
        with transaction.atomic():  # ours, open while the other enqueues
            mine = django_pgjobs.enqueue("tests.capped", {"who": "first"})
            assert mine.status == "ready"
            with other_connection.cursor() as cursor:
                # The slot is locked by our open transaction: skipped, and the job waits.
                other_id, other_status = insert_capped(cursor)
            assert other_status == "throttled"
        other_connection.commit()
        assert statuses(mine, Job(pk=other_id)) == ["ready", "throttled"]
        assert Job.objects.filter(status="ready").count() == 1
    finally:
        other_connection.rollback()
        other_connection.set_autocommit(True)
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")


@pytest.mark.django_db(transaction=True)
def test_a_slot_freed_before_its_waiting_job_committed_is_given_by_the_next_step(
    other_connection,
) -> None:
    holder = django_pgjobs.enqueue("tests.capped", {})
    [c] = claim_jobs("w", "default", 1)
    other_connection.set_autocommit(False)
    try:
        with other_connection.cursor() as cursor:
            late_id, late_status = insert_capped(cursor)
        assert late_status == "throttled"
        # The settle frees the slot; the job that would take it is not committed, not seen.
        settle([succeeded(c)])
        other_connection.commit()
    finally:
        other_connection.rollback()
        other_connection.set_autocommit(True)
    assert statuses(holder, Job(pk=late_id)) == ["succeeded", "throttled"]
    assert admit_waiting_keys(100) == 1
    assert statuses(Job(pk=late_id)) == ["ready"]
    assert admit_waiting_keys(100) == 0


def test_a_slot_whose_holder_is_gone_is_freed_and_logged(caplog) -> None:
    from django_pgjobs.maintenance import OrphanedSlotsStep

    gone = enqueue_for("acme", 1)[0]
    enqueue_for("acme", 1)
    waiting = enqueue_for("acme", 1)[0]
    Job.objects.filter(pk=gone.pk).delete()  # a delete frees nothing: no trigger sees it
    assert held("tests.limited:acme")[0] == gone.pk
    with caplog.at_level("ERROR", logger="django_pgjobs.maintenance"):
        assert OrphanedSlotsStep(start=KeySlot.objects.order_by("pk")[0].pk - 1)() == 1
    assert f"limit.orphaned_slot key=tests.limited:acme slot=0 job={gone.pk}" in caplog.text
    assert held("tests.limited:acme")[0] is None and statuses(waiting) == ["throttled"]
    assert admit_waiting_keys(100) == 1
    assert statuses(waiting) == ["ready"]
    assert unheld_slots() == []


def test_the_look_for_orphaned_slots_reads_a_window_at_a_time_and_starts_over() -> None:
    from django_pgjobs.maintenance import OrphanedSlotsStep

    # Six slot rows, two a key, in this order: acme's two held, globex's two held, initech's
    # first held and its second free.
    holders = enqueue_for("acme", 2) + enqueue_for("globex", 2) + enqueue_for("initech", 1)
    rows = list(KeySlot.objects.order_by("pk").values_list("pk", "job_id"))
    before = rows[0][0] - 1
    assert rows == [(before + i + 1, job) for i, job in
                    enumerate([h.pk for h in holders] + [None])]
    Job.objects.filter(pk=holders[4].pk).delete()
    # Windows of two slot rows: acme's and globex's find nothing and say where the next starts;
    # initech's reaches the last slot row, frees the orphan there, and starts over.
    assert free_orphaned_slots(100, after=before, scan=2) == ([], before + 2)
    assert free_orphaned_slots(100, after=before + 2, scan=2) == ([], before + 4)
    assert free_orphaned_slots(100, after=before + 4, scan=2) == (
        [("tests.limited:initech", 0, holders[4].pk)], before)
    # A look stopped at its limit takes the same window again.
    Job.objects.filter(pk__in=[holders[0].pk, holders[1].pk]).delete()
    assert free_orphaned_slots(1, after=before, scan=2) == (
        [("tests.limited:acme", 0, holders[0].pk)], before)
    assert free_orphaned_slots(1, after=before, scan=2) == (
        [("tests.limited:acme", 1, holders[1].pk)], before)
    assert free_orphaned_slots(1, after=before, scan=2) == ([], before + 2)
    assert unheld_slots() == []
    # The step keeps its place from run to run: acme's window, globex's, initech's.
    Job.objects.filter(pk=holders[3].pk).delete()
    step = OrphanedSlotsStep(scan=2, start=before)
    assert (step(), step.after) == (0, before + 2)
    assert (step(), step.after) == (1, before + 4)
    assert (step(), step.after) == (0, before)
    assert unheld_slots() == []


def test_a_workers_first_look_for_orphaned_slots_starts_at_a_slot_row_at_random() -> None:
    from django_pgjobs.maintenance import OrphanedSlotsStep

    assert orphaned_slots_start() == 0  # no slot rows
    jobs = django_pgjobs.enqueue_many([JobSpec.of("tests.limited", {"customer": f"c{i}"})
                                       for i in range(200)])
    first, last = (KeySlot.objects.order_by(order).values_list("pk", flat=True)[0]
                   for order in ("pk", "-pk"))
    starts = {orphaned_slots_start() for _ in range(20)}
    assert all(first - 1 <= start < last for start in starts)
    assert len(starts) > 1
    # The holder of the first slot row is gone: a look that starts past it finds it only once
    # it has gone round. Wherever it starts, the step reads every slot row: 400, five windows.
    assert KeySlot.objects.get(pk=first).job_id == jobs[0].pk
    Job.objects.filter(pk=jobs[0].pk).delete()
    step = OrphanedSlotsStep(scan=100)
    assert sum(step() for _ in range(6)) == 1
    assert unheld_slots() == []


def test_the_look_for_orphaned_slots_takes_any_window_under_server_side_binding() -> None:
    from django.db.backends.postgresql.base import ServerBindingCursor

    enqueue_for("acme", 1)
    connection.ensure_connection()
    raw = connection.connection
    factory, raw.cursor_factory = raw.cursor_factory, ServerBindingCursor
    try:
        # Each number a smallint by itself: their sum is not.
        assert free_orphaned_slots(100, after=30_000, scan=5_000)[0] == []
    finally:
        raw.cursor_factory = factory


def test_an_operator_limit_raises_and_lowers_a_keys_limit_and_is_audited() -> None:
    jobs = enqueue_for("acme", 5)
    assert [j.status for j in jobs] == ["ready"] * 2 + ["throttled"] * 3
    assert set_key_limit("tests.limited:acme", 4, actor=Actor("op"), reason="big tenant") == 2
    assert statuses(*jobs) == ["ready"] * 4 + ["throttled"]
    audit = OperatorAction.objects.get()
    assert (audit.action, audit.actor_name, audit.detail) == (
        "set_key_limit", "op", {"key": "tests.limited:acme", "max_running": 4, "before": None,
                                "admitted": 2})
    # Lowered to 1 with four held: nothing new starts until the held ones are down to none
    # above the new limit, and none is interrupted.
    assert set_key_limit("tests.limited:acme", 1) == 0
    claimed = {c.id: c for c in claim_jobs("w", "default", 10)}
    assert len(claimed) == 4
    for job in jobs[:3]:
        settle([succeeded(claimed[job.pk])])
        assert statuses(jobs[4]) == ["throttled"]
    settle([succeeded(claimed[jobs[3].pk])])
    # The last one above the new limit freed its slot (3, above it): the limits step gives the
    # key's first slot to its waiting job.
    assert statuses(jobs[4]) == ["throttled"]
    assert admit_waiting_keys(100) == 1
    assert statuses(jobs[4]) == ["ready"]
    assert held("tests.limited:acme") == {0: jobs[4].pk, 1: None, 2: None, 3: None}
    assert KeyLimit.objects.get().max_running == 1


@pytest.mark.parametrize(("key", "max_running", "message"), [
    ("", 2, "key must not be empty"),
    ("k", 0, "max_running must be a whole number from 1 to 10000"),
    ("k", 2.0, "max_running must be a whole number"),
])
def test_a_bad_operator_limit_is_refused_and_writes_nothing(key, max_running, message) -> None:
    with pytest.raises(ValueError, match=message):
        set_key_limit(key, max_running)
    assert not KeyLimit.objects.exists() and not OperatorAction.objects.exists()


# --- real workers ---------------------------------------------------------------------------------


def overlap(windows: list[tuple[Any, Any]]) -> int:
    """The most of ``windows`` (start, end) open at one instant."""
    events = sorted([(start, 1) for start, _ in windows] + [(end, -1) for _, end in windows],
                    key=lambda e: (e[0], e[1]))
    most = current = 0
    for _, step in events:
        current += step
        most = max(most, current)
    return most


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_workers_never_run_more_of_a_key_than_its_limit_and_a_killed_one_frees_its_slot(
    start_worker,
) -> None:
    hang = django_pgjobs.enqueue("demo.export", {"customer": "hang", "seconds": 30},
                                 priority=10, max_attempts=1)
    jobs = django_pgjobs.enqueue_many(
        [JobSpec.of("demo.export", {"customer": f"c{i % 3}", "seconds": 0.05}) for i in range(30)])
    victim = start_worker("--worker-id", "victim", "--concurrency", "1", "--batch-size", "1")
    wait_for(lambda: Job.objects.get(pk=hang.pk).status == "running", 30)
    victim.signal(signal.SIGKILL)
    victim.wait(10)
    hang_again = django_pgjobs.enqueue("demo.export", {"customer": "hang", "seconds": 0.05})
    assert statuses(hang_again) == ["throttled"]
    # Three workers of four executors each, against keys of limit 1.
    for n in range(3):
        start_worker("--worker-id", f"w{n}", "--concurrency", "4")
    # The dead worker's lease (2 s) runs out, the rescue frees its slot, the next job runs.
    wait_for(lambda: Job.objects.get(pk=hang_again.pk).status == "succeeded", 60,
             what=lambda: str(statuses(hang, hang_again)))
    assert statuses(hang) == ["dead"]
    wait_for(lambda: Job.objects.filter(pk__in=[j.pk for j in jobs],
                                        status="succeeded").count() == 30, 60)
    by_key: dict[str, list[tuple[Any, Any]]] = {}
    exports = Job.objects.filter(task="demo.export").values_list("pk", flat=True)
    for attempt in ended_attempts(*exports):
        by_key.setdefault(attempt.job.limit_key, []).append(
            (attempt.claimed_at, attempt.finished_at))
    assert set(by_key) >= {"demo.export:c0", "demo.export:c1", "demo.export:c2",
                           "demo.export:hang"}
    assert {key: overlap(windows) for key, windows in by_key.items()} == dict.fromkeys(by_key, 1)


# --- operators see it and steer it ----------------------------------------------------------------


def test_stats_show_each_keys_holders_limit_and_waiting_jobs() -> None:
    from io import StringIO

    from django.core.management import call_command

    from django_pgjobs import stats

    enqueue_for("acme", 5)
    enqueue_for("solo", 1)
    claim_jobs("w", "default", 1)  # the first acme job runs
    set_key_limit("tests.limited:solo", 3)
    by_key = {k.key: k for k in stats.key_limits()}
    acme, solo = by_key["tests.limited:acme"], by_key["tests.limited:solo"]
    assert (acme.running, acme.ready, acme.max_running, acme.set_by_operator, acme.waiting) == (
        1, 1, 2, False, 3)
    assert acme.oldest_waiting_seconds is not None and acme.oldest_waiting_seconds >= 0
    assert (solo.running, solo.ready, solo.max_running, solo.set_by_operator, solo.waiting) == (
        0, 1, 3, True, 0)
    assert list(by_key) == ["tests.limited:acme", "tests.limited:solo"]  # most waiting first
    out = StringIO()
    call_command("pgjobs_stats", stdout=out)
    [row] = [line.split() for line in out.getvalue().splitlines()
             if line.startswith("tests.limited:acme")]
    assert row[:5] == ["tests.limited:acme", "1", "1", "2", "3"]


ADD_LIMIT = "/admin/pgjobs/keylimit/add/"


def test_an_operator_with_the_permission_sets_a_keys_limit_in_the_admin(login) -> None:
    jobs = enqueue_for("acme", 4)
    client = login("view_keylimit", "add_keylimit")
    response = client.post(ADD_LIMIT, {"key": "tests.limited:acme", "max_running": "3",
                                       "reason": "contract upgrade"})
    assert response.status_code == 302, response.content.decode()[:2000]
    assert statuses(*jobs) == ["ready", "ready", "ready", "throttled"]
    audit = OperatorAction.objects.get()
    assert (audit.action, audit.actor_name, audit.reason, audit.detail["admitted"]) == (
        "set_key_limit", "op", "contract upgrade", 1)
    assert KeyLimit.objects.get().changed_by == "op"


@pytest.mark.parametrize(("codenames", "form", "expected"), [
    (("view_keylimit",), {"key": "tests.limited:acme", "max_running": "3"}, 403),
    (("view_keylimit", "add_keylimit"), {"key": "a\nb", "max_running": "3"}, 200),
    (("view_keylimit", "add_keylimit"), {"key": "tests.limited:acme", "max_running": "0"}, 200),
])
def test_a_limit_without_the_permission_or_with_bad_input_writes_nothing(
    login, codenames, form, expected,
) -> None:
    client = login(*codenames)
    response = client.post(ADD_LIMIT, form)
    assert response.status_code == expected
    if expected == 200:
        assert "errorlist" in response.content.decode()
    assert not KeyLimit.objects.exists() and not OperatorAction.objects.exists()


def test_an_operators_limit_cannot_be_deleted_in_the_admin(login) -> None:
    set_key_limit("tests.limited:acme", 3)
    client = login(superuser=True)
    row = KeyLimit.objects.get()
    assert client.post(f"/admin/pgjobs/keylimit/{row.pk}/delete/", {"post": "yes"}
                       ).status_code == 403
    assert KeyLimit.objects.exists()


def test_drain_in_a_test_runs_a_keys_jobs_one_slot_after_another() -> None:
    from django_pgjobs import testing

    jobs = enqueue_for("acme", 5)
    assert [j.status for j in jobs].count("throttled") == 3
    drained = testing.drain()
    assert drained.outcomes == {"succeeded": 5}
    assert statuses(*jobs) == ["succeeded"] * 5
    assert held("tests.limited:acme") == {0: None, 1: None}


def test_the_metrics_export_each_busy_keys_held_waiting_and_limit() -> None:
    from prometheus_client import CollectorRegistry

    from django_pgjobs.metrics import StatsCollector, exposition
    from tests.test_metrics import parse, value

    enqueue_for("acme", 5)
    claim_jobs("w", "default", 1)
    registry = CollectorRegistry()
    registry.register(StatsCollector())
    samples = parse(exposition(registry))
    key = "tests.limited:acme"
    assert (value(samples, "pgjobs_limit_held", key=key),
            value(samples, "pgjobs_limit_waiting", key=key),
            value(samples, "pgjobs_limit_max_running", key=key)) == (2, 3, 2)
    assert value(samples, "pgjobs_jobs", queue="default", status="throttled") == 3


def test_the_limits_page_lists_the_keys_in_use_before_the_operators_rows(login) -> None:
    enqueue_for("acme", 4)
    claim_jobs("w", "default", 1)
    set_key_limit("tests.limited:other", 5)
    client = login("view_keylimit")
    page = client.get("/admin/pgjobs/keylimit/").content.decode()
    table = page.split('id="pgjobs-limit-keys"', 1)[1].split("</table>", 1)[0]
    cells = [re.findall(r"<t[hd][^>]*>([^<]*)</t[hd]>", row)
             for row in table.split("<tr>")[2:]]
    assert cells == [["tests.limited:acme", "1", "1", "2", "2", "0s", "-", "-"],
                     ["tests.limited:other", "0", "0", "5 (set here)", "0", "-", "-", "-"]]
    assert "Limits set by operators" in page and "tests.limited:other" in page.split(
        "Limits set by operators", 1)[1]


def test_a_jobs_page_in_the_admin_shows_its_limit_key_and_slot(login) -> None:
    first, waiting = enqueue_for("acme", 3)[0::2]
    client = login("view_job")
    page = client.get(f"/admin/pgjobs/job/{first.pk}/change/").content.decode()
    limit = re.split(r">Limit</h\d>", page, maxsplit=1)[1].split("</fieldset>", 1)[0]
    assert "tests.limited:acme" in limit
    assert re.search(r"field-limit_slot.*?<div class=\"readonly\">0</div>", limit, re.S)
    page = client.get(f"/admin/pgjobs/job/{waiting.pk}/change/").content.decode()
    assert "throttled" in page


def test_each_row_trigger_asks_one_column_in_its_when_and_its_function_the_rest() -> None:
    # PostgreSQL prepares a trigger's WHEN anew for every statement that may fire it: whole
    # conditions there cost every claim and settlement about 55 us (migration 0020). The
    # rest of each condition is the first thing its function tests.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger"
            " WHERE tgrelid = 'pgjobs_job'::regclass AND NOT tgisinternal")
        whens = {name: re.search(r" WHEN \((.*)\) EXECUTE", definition)
                 for name, definition in cursor.fetchall()}
    assert {name: found.group(1) if found else None for name, found in whens.items()} == {
        "pgjobs_limit_park_insert": "(new.limit_key IS NOT NULL)",
        "pgjobs_limit_park_update": "(new.limit_key IS NOT NULL)",
        "pgjobs_rate_start": "(old.rate_interval IS NOT NULL)",
        "pgjobs_limit_parked": "((new.status)::text = 'throttled'::text)",
        "pgjobs_limit_release": "(old.limit_slot IS NOT NULL)",
        "pgjobs_dependency_ended": "new.has_dependents",
        "pgjobs_limit_hand_over_released": None,  # a statement trigger
    }


def test_a_limited_job_changed_between_ended_statuses_frees_nothing_again() -> None:
    # What the release's moved condition keeps out: a slot is released once, when its job
    # leaves the limit's statuses, never by a later change between ended ones.
    first, second, third = enqueue_for("acme", 3)
    assert statuses(first, second, third) == ["ready", "ready", "throttled"]
    [claimed] = claim_jobs("w1", "default", 1)
    settle([succeeded(claimed)])
    assert statuses(first, second, third) == ["succeeded", "ready", "ready"]
    holders = held("tests.limited:acme")
    assert sorted(j for j in holders.values() if j is not None) == [second.pk, third.pk]
    Job.objects.filter(pk=first.pk).update(status=JobStatus.DEAD)
    assert held("tests.limited:acme") == holders
    assert statuses(first, second, third) == ["dead", "ready", "ready"]
