from __future__ import annotations

import json
import re
from datetime import datetime, timedelta

import pytest
from django.db import connection, transaction
from django.db.models.signals import post_init
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import django_pgjobs
from django_pgjobs import (
    EnqueueError,
    InvalidJobOption,
    PayloadNotJSON,
    PayloadTooLarge,
    UnknownQueue,
    UnknownTask,
    payloads,
)
from django_pgjobs.enqueuing import JobSpec, Tick, validate
from django_pgjobs.models import Job
from django_pgjobs.rows import ROW_COLUMNS
from django_pgjobs.sql import query
from django_pgjobs.status import JobStatus
from django_pgjobs.transitions import claim_jobs
from tests.handlers import ok

pytestmark = pytest.mark.django_db


@pytest.mark.django_db(transaction=True)
def test_rollback_of_the_callers_transaction_leaves_no_job() -> None:
    class Boom(Exception):
        pass

    with pytest.raises(Boom), transaction.atomic():
        django_pgjobs.enqueue("tests.ok", {"order": 1})
        assert Job.objects.count() == 1  # visible inside the caller's transaction
        raise Boom
    assert Job.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_commit_makes_the_job_claimable(other_connection: object) -> None:
    with transaction.atomic():
        job = django_pgjobs.enqueue("tests.ok", {"order": 1})
        # Not visible to another connection before commit.
        with other_connection.cursor() as cursor:  # type: ignore[attr-defined]
            cursor.execute("SELECT count(*) FROM pgjobs_job")
            assert cursor.fetchone()[0] == 0
    claimed = claim_jobs("w1", "default", 10)
    assert [c.id for c in claimed] == [job.id]


def test_enqueue_returns_a_saved_job_with_database_times() -> None:
    before = timezone.now()
    job = django_pgjobs.enqueue("tests.ok", {"a": 1}, priority=5, trace_id="req-1")
    stored = Job.objects.get(pk=job.pk)
    assert job.created is True
    assert stored.status == JobStatus.READY == job.status
    assert stored.priority == stored.base_priority == 5
    assert stored.payload == {"a": 1}
    assert stored.trace_id == "req-1"
    assert stored.run_at == stored.created_at == job.created_at
    assert stored.created_at >= before - timedelta(seconds=5)
    assert stored.deadline is not None and stored.deadline > stored.created_at


def test_delay_and_run_at_schedule_the_job() -> None:
    delayed = django_pgjobs.enqueue("tests.ok", {}, delay=timedelta(minutes=5))
    at = timezone.now() + timedelta(hours=2)
    timed = django_pgjobs.enqueue("tests.ok", {}, run_at=at)
    assert delayed.status == timed.status == JobStatus.SCHEDULED
    assert Job.objects.get(pk=delayed.pk).run_at - Job.objects.get(pk=delayed.pk).created_at == (
        timedelta(minutes=5)
    )
    assert Job.objects.get(pk=timed.pk).run_at == at


def test_same_idempotency_key_returns_the_existing_job_and_writes_nothing() -> None:
    first = django_pgjobs.enqueue("tests.ok", {"v": 1}, idempotency_key="order:42")
    second = django_pgjobs.enqueue("tests.ok", {"v": 2}, idempotency_key="order:42")
    assert second.pk == first.pk
    assert second.created is False
    assert second.payload == {"v": 1}
    assert Job.objects.count() == 1
    # The key is per task: another task may use the same key.
    other = django_pgjobs.enqueue("tests.transient", {}, idempotency_key="order:42")
    assert other.pk != first.pk and Job.objects.count() == 2


def test_handler_shortcut_and_handler_defaults() -> None:
    job = ok.enqueue({"x": 1}, queue="fast")
    assert (job.task, job.queue, job.max_attempts) == ("tests.ok", "fast", 20)


def sent_by(queries: CaptureQueriesContext) -> list[str]:
    """What was sent, without the savepoints of the test's transaction."""
    return [q["sql"] for q in queries.captured_queries
            if not q["sql"].startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))]


def test_enqueue_many_is_one_statement_in_order() -> None:
    specs = [JobSpec.of("tests.ok", {"i": i}, priority=i % 3) for i in range(50)]
    with CaptureQueriesContext(connection) as queries:
        jobs = django_pgjobs.enqueue_many(specs)
    [sent] = sent_by(queries)
    assert "INSERT INTO pgjobs_job" in sent
    assert [j.payload for j in jobs] == [{"i": i} for i in range(50)]
    assert [Job.objects.get(pk=j.pk).payload for j in jobs] == [{"i": i} for i in range(50)]
    assert Job.objects.count() == 50


@pytest.mark.parametrize("key", ["idempotency_key", "unique_key", "tick"])
@pytest.mark.parametrize("count", [1, 3])
def test_only_an_insert_with_a_key_or_a_tick_skips_conflicts_and_each_key_still_dedupes(
        key, count) -> None:
    from tests.factories import ScheduleFactory

    tick = Tick(ScheduleFactory().pk, timezone.now()) if key == "tick" else None
    options = {} if key == "tick" else {key: "k"}

    def specs() -> list[JobSpec]:
        plain = [JobSpec.of("tests.ok", {"i": i}) for i in range(count - 1)]
        return [*plain, JobSpec("tests.ok", {"i": "keyed"}, options, tick=tick)]

    with CaptureQueriesContext(connection) as queries:
        django_pgjobs.enqueue_many([JobSpec.of("tests.ok", {"i": i}) for i in range(count)])
        first = django_pgjobs.enqueue_many(specs())
        again = django_pgjobs.enqueue_many(specs())
    inserts = [q for q in sent_by(queries) if "INSERT INTO pgjobs_job" in q]
    assert ["ON CONFLICT DO NOTHING" in q for q in inserts] == [False, True, True]
    assert (first[-1].created, again[-1].created, again[-1].pk) == (True, False, first[-1].pk)
    assert Job.objects.count() == 3 * count - 1


def test_a_key_repeated_in_one_batch_costs_one_read_of_its_holder() -> None:
    specs = [JobSpec.of("tests.ok", {"i": "dup"}, idempotency_key="k"),
             JobSpec.of("tests.ok", {"i": "dup-again"}, idempotency_key="k"),
             JobSpec.of("tests.ok", {"i": "other"})]
    with CaptureQueriesContext(connection) as queries:
        jobs = django_pgjobs.enqueue_many(specs)
    insert, holder = sent_by(queries)
    assert "INSERT INTO pgjobs_job" in insert and holder.startswith("SELECT")
    assert jobs[0].pk == jobs[1].pk != jobs[2].pk
    assert (jobs[0].created, jobs[1].created, jobs[2].created) == (True, False, True)
    assert Job.objects.get(pk=jobs[1].pk).payload == {"i": "dup"}
    assert Job.objects.count() == 2


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: django_pgjobs.enqueue("no.such.task", {}), UnknownTask,
         "unknown task 'no.such.task'"),
        (lambda: django_pgjobs.enqueue("tests.ok", {"when": datetime(2026, 1, 1)}), PayloadNotJSON,
         "payload['when']: datetime is not JSON"),
        (lambda: django_pgjobs.enqueue("tests.ok", {"items": [1, {"x": {1, 2}}]}), PayloadNotJSON,
         "payload['items'][1]['x']: set is not JSON"),
        (lambda: django_pgjobs.enqueue("tests.ok", {1: "a"}), PayloadNotJSON,
         "key 1 is a int, not a string"),
        (lambda: django_pgjobs.enqueue("tests.ok", {"x": "a\x00b"}), PayloadNotJSON,
         "payload['x']: contains a NUL character"),
        (lambda: django_pgjobs.enqueue("tests.ok", {"x": float("nan")}), PayloadNotJSON,
         "not a finite number"),
        (lambda: django_pgjobs.enqueue("tests.ok", ("a", "b")), PayloadNotJSON,
         "tuple is not JSON"),
        (lambda: django_pgjobs.enqueue("tests.ok", {"blob": "x" * 70_000}), PayloadTooLarge,
         "enqueue a reference to it"),
        (lambda: django_pgjobs.enqueue("tests.ok", {}, run_at=datetime(2030, 1, 1)),
         InvalidJobOption, "naive datetime"),
        (lambda: django_pgjobs.enqueue("tests.ok", {}, priority=101), InvalidJobOption,
         "priority must be a whole number from -100 to 100"),
        (lambda: django_pgjobs.enqueue("tests.ok", {}, priority=True), InvalidJobOption,
         "priority must be a whole number"),
        (lambda: django_pgjobs.enqueue("tests.ok", {}, delay=-1), InvalidJobOption,
         "delay must be from 0 to 3.1536e+08 seconds, got -1"),
        (lambda: django_pgjobs.enqueue("tests.ok", {}, delay=1, run_at=timezone.now()),
         InvalidJobOption, "not both"),
        (lambda: django_pgjobs.enqueue("tests.ok", {}, max_attempts=0), InvalidJobOption,
         "max_attempts"),
        (lambda: django_pgjobs.enqueue("tests.ok", {}, lease=timedelta(0)), InvalidJobOption,
         "lease must be from 1 to 604800 seconds, got datetime.timedelta(0)"),
        (lambda: django_pgjobs.enqueue("tests.ok", {}, idempotency_key=""), InvalidJobOption,
         "idempotency_key"),
        (lambda: django_pgjobs.enqueue("tests.ok", {}, queue=""), UnknownQueue, "queue"),
        (lambda: django_pgjobs.enqueue("tests.ok", {}, colour="red"), InvalidJobOption,
         "unknown enqueue option(s): colour"),
    ],
)
def test_bad_input_is_refused_with_a_clear_error_and_writes_nothing(call, error, message) -> None:
    django_pgjobs.enqueue("tests.ok", {"kept": True})
    with pytest.raises(error) as raised:
        call()
    assert message in str(raised.value)
    assert list(Job.objects.values_list("payload", flat=True)) == [{"kept": True}]


def test_one_bad_job_in_a_bulk_enqueue_writes_none_of_them() -> None:
    specs = [JobSpec.of("tests.ok", {"i": 1}), JobSpec.of("tests.ok", {"i": object()})]
    with pytest.raises(PayloadNotJSON):
        django_pgjobs.enqueue_many(specs)
    assert Job.objects.count() == 0


def test_declared_queues_refuse_unknown_ones(settings) -> None:
    settings.PGJOBS_QUEUES = ["default", "billing"]
    django_pgjobs.enqueue("tests.ok", {}, queue="billing")
    with pytest.raises(UnknownQueue, match="unknown queue 'emails'"):
        django_pgjobs.enqueue("tests.ok", {}, queue="emails")
    assert list(Job.objects.values_list("queue", flat=True)) == ["billing"]


def test_payload_limit_follows_the_setting(settings) -> None:
    settings.PGJOBS_MAX_PAYLOAD_BYTES = 100
    django_pgjobs.enqueue("tests.ok", {"x": "y" * 50})
    with pytest.raises(PayloadTooLarge, match="over the 100-byte limit"):
        django_pgjobs.enqueue("tests.ok", {"x": "y" * 100})
    assert Job.objects.count() == 1


@pytest.mark.parametrize("order", [("tests.ok", "tests.transient"),
                                   ("tests.transient", "tests.ok")])
def test_enqueue_many_tells_apart_two_tasks_that_share_an_idempotency_key(order) -> None:
    first, second = order
    existing = django_pgjobs.enqueue(second, {"old": True}, idempotency_key="shared")
    # The spec whose key is taken comes first: matched by key alone, it would be handed the
    # row inserted for the other task.
    jobs = django_pgjobs.enqueue_many([
        JobSpec.of(second, {"new": 2}, idempotency_key="shared"),
        JobSpec.of(first, {"new": 1}, idempotency_key="shared"),
        JobSpec.of(first, {"new": 3}, idempotency_key="shared"),
    ])
    assert [(j.task, j.created) for j in jobs] == [
        (second, False), (first, True), (first, False)]
    assert jobs[0].pk == existing.pk
    assert jobs[2].pk == jobs[1].pk != existing.pk
    stored = {j.pk: (j.task, j.payload) for j in Job.objects.all()}
    assert stored == {existing.pk: (second, {"old": True}), jobs[1].pk: (first, {"new": 1})}



def _columns(job: Job) -> dict[str, object]:
    return {field.attname: getattr(job, field.attname) for field in Job._meta.concrete_fields}


@pytest.mark.parametrize(("options", "repeat_is_new"), [
    ({}, True),
    ({"idempotency_key": "order:7", "priority": 4}, False),
    ({"unique_key": "report", "queue": "fast"}, False),
    ({"delay": timedelta(minutes=3), "trace_id": "req-9", "lease": timedelta(seconds=12.5)}, True),
], ids=["plain", "idempotency-keyed", "unique-keyed", "delayed"])
def test_returned_jobs_equal_the_stored_rows_field_by_field(
    options, repeat_is_new, django_assert_num_queries
) -> None:
    # Two tasks with the options, a plain job between; the last two repeat the first ones'
    # task and options (a keyed repeat is answered with the job holding the key).
    specs = [JobSpec.of("tests.ok", {"n": 1}, **options), JobSpec.of("tests.ok", {"n": 2}),
             JobSpec.of("tests.transient", {"n": 3}, **options),
             JobSpec.of("tests.ok", {"n": 4}), JobSpec.of("tests.transient", {"n": 5}, **options)]
    jobs = django_pgjobs.enqueue_many(specs)
    with django_assert_num_queries(0):  # every column is loaded: none is fetched on access
        returned = [_columns(job) for job in jobs]
    stored = [Job.objects.get(pk=job.pk) for job in jobs]
    assert returned == [_columns(job) for job in stored]
    # Equal instants are not enough: times carry the very time zone the ORM reads them with.
    assert [repr(columns) for columns in returned] == [repr(_columns(job)) for job in stored]
    assert jobs == stored
    assert [(job.created, job._state.adding, job._state.db) for job in jobs] == [
        (True, False, "default")] * 4 + [(repeat_is_new, False, "default")]
    assert [job.payload for job in jobs] == [
        {"n": 1}, {"n": 2}, {"n": 3}, {"n": 4}, {"n": 5} if repeat_is_new else {"n": 3}]


PAYLOADS = [
    {"text": 'quote " backslash \\ newline \n tab \t bell \x07 slash /'},
    {"snow": "\u2603 \U0001f600 caf\u00e9", "\u00e9t\u00e9": ["\u00e0", "\u00fc"]},
    {"big": 2**100, "small": -(2**63), "float": 0.1, "tiny": 5e-324, "large": 1.5e15},
    {"deep": [[[{"a": [None, True, False, ""]}]]], "empty": {}, "none": []},
    ["a", 1, 2.5, None],
    "just text",
    12,
    None,
]


def test_every_payload_comes_back_as_it_was_given_from_one_bulk_enqueue() -> None:
    jobs = django_pgjobs.enqueue_many([JobSpec.of("tests.ok", p) for p in PAYLOADS])
    assert [job.payload for job in jobs] == PAYLOADS
    assert [Job.objects.get(pk=job.pk).payload for job in jobs] == PAYLOADS


@pytest.mark.parametrize("compiled", [True, False], ids=["C encoder", "pure Python"])
def test_payloads_are_encoded_as_json_dumps_would(compiled, monkeypatch) -> None:
    if not compiled:
        monkeypatch.setattr(payloads, "_C_ENCODER", None)
    assert [payloads.encode_json(p) for p in PAYLOADS] == [
        json.dumps(p, separators=(",", ":"), ensure_ascii=False) for p in PAYLOADS]


# jsonb prints a number without an exponent: 1e+16 would come back as an int.
EXPONENT_FLOATS = {"e16": 1e16, "negative": -1.5e17, "largest": 1.7976931348623157e308,
                   "below": 9999999999999998.0, "nested": [{"x": 2.5e22}, 1e-7, 3]}


def test_floats_of_an_exponent_come_back_floats_from_every_enqueue_and_a_result() -> None:
    from django_pgjobs.testing import drain

    single = django_pgjobs.enqueue("tests.ok", EXPONENT_FLOATS)
    [bulk] = django_pgjobs.enqueue_many([JobSpec.of("tests.ok", EXPONENT_FLOATS)])
    for job in (single, bulk):
        stored = Job.objects.get(pk=job.pk).payload
        assert stored == EXPONENT_FLOATS
        assert _typed(stored) == _typed(EXPONENT_FLOATS)  # 1e+16, not 10000000000000000
    runs = drain()
    results = [Job.objects.get(pk=run.job_id).result for run in runs]
    assert [_typed(result) for result in results] == [_typed({"echo": EXPONENT_FLOATS})] * 2


def _typed(value: object) -> str:
    # json.dumps writes a float 1e+16 and the int 10000000000000000 apart.
    return json.dumps(value, sort_keys=True)


def test_a_float_of_an_exponent_is_written_out_and_everything_else_as_json_dumps_would() -> None:
    value = {"f": 1e16, "s": "1e+16 \u2603 \"q\"", "n": None, "b": [True, False],
             "i": -(2**70), "small": 0.1}
    assert payloads.encode_json(value) == (
        '{"f":10000000000000000.0,"s":"1e+16 \u2603 \\"q\\"","n":null,"b":[true,false],'
        f'"i":{-(2**70)},"small":0.1}}')
    assert json.loads(payloads.encode_json(value)) == value


def test_a_result_written_out_keeps_what_json_dumps_makes_of_tuples_and_keys() -> None:
    result = {1: (1e16, "a"), None: 2, False: -2.5e20, 2.5: [], "s": {"t": 1e-7}}
    assert payloads.written_out(result) == (
        '{"1":[10000000000000000.0,"a"],"null":2,"false":-250000000000000000000.0,"2.5":[],'
        '"s":{"t":1e-07}}')
    assert json.loads(payloads.written_out(result)) == json.loads(json.dumps(result))


def test_jobs_of_interleaved_options_and_ticks_keep_their_own_values_and_order() -> None:
    from tests.factories import ScheduleFactory

    schedule = ScheduleFactory()
    zone = timezone.get_fixed_timezone(330)
    ticks = [Tick(schedule.pk, datetime(2026, 12, 1, 9, 30, 0, n * 1001, tzinfo=zone))
             for n in range(3)]
    specs = []
    for n in range(12):
        options = [{}, {"queue": "fast", "priority": 3}, {"delay": 30, "max_attempts": 2}][n % 3]
        specs.append(JobSpec("tests.ok", {"n": n}, options,
                             tick=ticks[n // 4] if n % 4 == 3 else None))
    jobs = django_pgjobs.enqueue_many(specs)
    stored = [Job.objects.get(pk=job.pk) for job in jobs]
    assert [job.payload for job in stored] == [{"n": n} for n in range(12)]
    assert [(job.queue, job.priority, job.max_attempts, job.status) for job in stored] == [
        [("default", 0, 20, "ready"), ("fast", 3, 20, "ready"),
         ("default", 0, 2, "scheduled")][n % 3] for n in range(12)]
    assert [(job.schedule_id, job.scheduled_at) for job in stored] == [
        (schedule.pk, ticks[n // 4].scheduled_at) if n % 4 == 3 else (None, None)
        for n in range(12)]
    assert [_columns(job) for job in jobs] == [_columns(job) for job in stored]


def test_returned_times_are_naive_like_the_orms_without_time_zone_support(settings) -> None:
    settings.USE_TZ = False
    jobs = django_pgjobs.enqueue_many([JobSpec.of("tests.ok", {"n": n}) for n in range(2)])
    stored = [Job.objects.get(pk=job.pk) for job in jobs]
    assert [repr(_columns(job)) for job in jobs] == [repr(_columns(job)) for job in stored]
    assert [job.created_at.tzinfo for job in jobs] == [None, None]


def test_receivers_of_jobs_init_signal_get_one_call_per_job() -> None:
    payloads = []

    def receiver(sender: type[Job], instance: Job, **kwargs: object) -> None:
        payloads.append(instance.payload)

    post_init.connect(receiver, sender=Job)
    try:
        django_pgjobs.enqueue_many([JobSpec.of("tests.ok", {"n": n}) for n in range(3)])
    finally:
        post_init.disconnect(receiver, sender=Job)
    assert payloads == [{"n": 0}, {"n": 1}, {"n": 2}]


def test_returned_jobs_save_and_refresh_like_fetched_ones() -> None:
    first, second = django_pgjobs.enqueue_many(
        [JobSpec.of("tests.ok", {"n": 1}), JobSpec.of("tests.ok", {"n": 2})])
    first.last_error = "noted"
    first.save(update_fields=["last_error"])
    Job.objects.filter(pk=second.pk).update(priority=9)
    second.refresh_from_db()
    assert (Job.objects.get(pk=first.pk).last_error, second.priority) == ("noted", 9)
    assert Job.objects.get(pk=second.pk).last_error == ""


@pytest.mark.parametrize(("bad", "message"), [
    (JobSpec.of("tests.ok", {"n": 2}, priority=True),
     "priority must be a whole number from -100 to 100, got True"),
    (JobSpec.of("tests.ok", {"n": 2}, priority=1.0),
     "priority must be a whole number from -100 to 100, got 1.0"),
    (JobSpec.of("tests.ok", {"n": {1, 2}}, priority=1),
     "not JSON at payload['n']: set is not JSON (use str, int, float, bool, None, list or dict)"),
    (JobSpec("tests.ok", {"n": 2}, {"priority": 1}, tick=Tick(0, timezone.now())),
     "tick must be a Tick(schedule_id, aware scheduled_at), got Tick(schedule_id=0"),
], ids=["bool-equal-to-an-int", "float-equal-to-an-int", "payload", "tick"])
def test_a_spec_whose_options_repeat_is_still_checked(bad, message) -> None:
    with pytest.raises(EnqueueError) as alone:
        validate(bad)
    with pytest.raises(EnqueueError) as in_bulk:
        django_pgjobs.enqueue_many([JobSpec.of("tests.ok", {"n": 1}, priority=1), bad])
    assert str(in_bulk.value) == str(alone.value)
    assert str(in_bulk.value).startswith(message)
    assert Job.objects.count() == 0


def test_one_job_and_many_name_the_same_row_values() -> None:
    # insert_jobs takes a row's values by position in u(...), insert_job by name: both are
    # rows.ROW_COLUMNS and the traceparent (and insert_jobs a workflow's three after them).
    aliases = re.search(r"AS u\(([^)]*)\)", query("insert_jobs"))
    assert aliases is not None
    assert [n.strip() for n in aliases.group(1).split(",")] == [
        *ROW_COLUMNS, "traceparent", "pending_dependencies", "has_dependents", "workflow_id"]
    named = re.findall(r"%\((\w+)\)s", query("insert_job"))
    assert set(named) == {*ROW_COLUMNS, "traceparent", "notify"}


def test_one_job_alone_is_stored_as_the_same_job_among_many() -> None:
    options = {"queue": "q1", "priority": 7, "delay": 30, "max_attempts": 3, "lease": 12,
               "timeout": 2.5, "trace_id": "t-1", "fairness_key": "tenant-1", "max_age": 600}
    alone = django_pgjobs.enqueue("tests.ok", {"n": 1}, idempotency_key="alone", **options)
    among = django_pgjobs.enqueue_many([
        JobSpec.of("tests.ok", {"n": 1}, idempotency_key="among", **options),
        JobSpec.of("tests.ok", {"n": 2})])[0]
    skip = {"id", "idempotency_key", "run_at", "deadline", "created_at", "updated_at"}
    fields = [f.attname for f in Job._meta.concrete_fields if f.attname not in skip]
    stored = Job.objects.in_bulk([alone.pk, among.pk])
    assert [getattr(stored[alone.pk], f) for f in fields] == [
        getattr(stored[among.pk], f) for f in fields]
    for job in (stored[alone.pk], stored[among.pk]):
        assert job.status == "scheduled"
        assert (job.run_at - job.created_at).total_seconds() == pytest.approx(30, abs=0.01)
        assert (job.deadline - job.created_at).total_seconds() == pytest.approx(600, abs=0.01)


def test_enqueue_sees_a_setting_change_at_once() -> None:
    assert django_pgjobs.enqueue("tests.ok", {}).queue == "default"
    with override_settings(PGJOBS_QUEUE="elsewhere", PGJOBS_MAX_PAYLOAD_BYTES=10):
        assert django_pgjobs.enqueue("tests.ok", {}).queue == "elsewhere"
        with pytest.raises(PayloadTooLarge):
            django_pgjobs.enqueue("tests.ok", {"n": "x" * 20})
    assert django_pgjobs.enqueue("tests.ok", {"n": "x" * 20}).queue == "default"


def test_single_enqueues_that_repeat_their_options_each_return_a_job_of_their_own() -> None:
    # From the second enqueue of a task and options on, a job is a copy of one built before.
    first = django_pgjobs.enqueue("tests.ok", {"n": 1}, priority=3, trace_id="t")
    first.priority = 99
    first.payload["n"] = "changed"
    jobs = [first] + [django_pgjobs.enqueue("tests.ok", {"n": n}, priority=3, trace_id="t")
                      for n in (2, 3)]
    assert [(job.priority, job.payload) for job in jobs[1:]] == [(3, {"n": 2}), (3, {"n": 3})]
    assert len({id(job._state) for job in jobs}) == 3
    for job in jobs[1:]:
        assert _columns(job) == _columns(Job.objects.get(pk=job.pk))
        assert (job.created, job._state.adding, job._state.db) == (True, False, "default")


def test_a_task_registered_again_is_checked_again() -> None:
    try:
        django_pgjobs.job("tests.enqueue.again", queue="first", max_attempts=2)(ok)
        assert django_pgjobs.enqueue("tests.enqueue.again", {}).queue == "first"
        assert django_pgjobs.enqueue("tests.enqueue.again", {}).queue == "first"
        django_pgjobs.registry.registry.remove("tests.enqueue.again")
        django_pgjobs.job("tests.enqueue.again", queue="second", max_attempts=5)(ok)
        job = django_pgjobs.enqueue("tests.enqueue.again", {})
        assert (job.queue, job.max_attempts) == ("second", 5)
        django_pgjobs.registry.registry.remove("tests.enqueue.again")
        with pytest.raises(UnknownTask):
            django_pgjobs.enqueue("tests.enqueue.again", {})
    finally:
        django_pgjobs.registry.registry.remove("tests.enqueue.again")


def test_a_receiver_of_jobs_init_signal_connected_after_enqueues_gets_every_later_job() -> None:
    for n in range(3):
        django_pgjobs.enqueue("tests.ok", {"n": n})
    payloads = []

    def receiver(sender: type[Job], instance: Job, **kwargs: object) -> None:
        payloads.append(instance.payload)

    post_init.connect(receiver, sender=Job)
    try:
        django_pgjobs.enqueue("tests.ok", {"n": 3})
        django_pgjobs.enqueue_many([JobSpec.of("tests.ok", {"n": n}) for n in (4, 5)])
    finally:
        post_init.disconnect(receiver, sender=Job)
    assert payloads == [{"n": 3}, {"n": 4}, {"n": 5}]
