"""A catalogue of bad input, each refused the same way.

For every entry: the error is an ``EnqueueError`` of the named kind whose message names the
option or the payload path at fault; no SQL is sent at all (so nothing is written and the
caller's transaction is not aborted); and the caller's transaction goes on to write a good job.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import suppress
from datetime import datetime, timedelta
from decimal import Decimal
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
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
    enqueuing,
    transitions,
)
from django_pgjobs.enqueuing import JobSpec
from django_pgjobs.exceptions import InvalidSetting, NotMigrated
from django_pgjobs.models import Job
from tests.handlers import ok

try:
    from django.tasks import task
except ImportError:  # Django < 6: the django-tasks backport
    from django_tasks import task

pytestmark = pytest.mark.django_db


@task()
def remember(label: str, detail: Any = None) -> str:
    return label


def deep(levels: int, kind: str = "list") -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value] if kind == "list" else {"k": value}
    return value


def enqueue(payload: Any = None, **options: Any) -> Callable[[], Any]:
    return lambda: django_pgjobs.enqueue("tests.ok", {} if payload is None else payload,
                                         **options)


LATER = timezone.now() + timedelta(days=30)
CATALOGUE: list[tuple[str, Callable[[], Any], type[Exception], str]] = [
    # --- the payload ---
    ("datetime value", enqueue({"when": datetime(2026, 1, 1)}), PayloadNotJSON,
     "payload['when']: datetime is not JSON"),
    ("set value", enqueue({"ids": {1, 2}}), PayloadNotJSON, "payload['ids']: set is not JSON"),
    ("bytes value", enqueue({"raw": b"\x00"}), PayloadNotJSON, "payload['raw']: bytes"),
    ("Decimal value", enqueue({"amount": Decimal("1.10")}), PayloadNotJSON,
     "payload['amount']: Decimal is not JSON"),
    ("object value", enqueue([object()]), PayloadNotJSON, "payload[0]: object is not JSON"),
    ("tuple payload", enqueue(("a", "b")), PayloadNotJSON, "payload: tuple is not JSON"),
    ("integer key", enqueue({1: "a"}), PayloadNotJSON, "key 1 is a int, not a string"),
    ("None key", enqueue({None: "a"}), PayloadNotJSON, "key None is a NoneType"),
    ("NUL in a value", enqueue({"x": "a\x00b"}), PayloadNotJSON,
     "payload['x']: contains a NUL character"),
    ("NUL in a key", enqueue({"a\x00": 1}), PayloadNotJSON, "contains a NUL character"),
    ("lone surrogate in a value", enqueue({"name": "bad \udcff"}), PayloadNotJSON,
     "payload['name']: contains a lone surrogate"),
    ("lone surrogate in a key", enqueue({"k\ud800": 1}), PayloadNotJSON, "lone surrogate"),
    ("lone surrogate deep in a list", enqueue({"a": [["ok", "\udfff"]]}), PayloadNotJSON,
     "payload['a'][0][1]: contains a lone surrogate"),
    ("NaN", enqueue({"x": float("nan")}), PayloadNotJSON, "payload['x']: nan is not a finite"),
    ("infinity", enqueue({"x": float("inf")}), PayloadNotJSON, "inf is not a finite number"),
    ("integer of 5000 digits", enqueue({"n": 10**5000}), PayloadNotJSON,
     "payload['n']: an integer beyond"),
    ("integer past 2**1024", enqueue({"n": -(2**1100)}), PayloadNotJSON, "an integer beyond"),
    ("10,000 nested lists", enqueue(deep(10_000)), PayloadNotJSON,
     "nested more than 32 levels deep (PGJOBS_MAX_PAYLOAD_DEPTH)"),
    ("33 nested objects", enqueue(deep(33, "dict")), PayloadNotJSON, "nested more than 32"),
    ("over the size limit", enqueue({"blob": "x" * 70_000}), PayloadTooLarge,
     "over the 65536-byte limit"),
    # --- the task ---
    ("unknown task name", lambda: django_pgjobs.enqueue("no.such.task", {}), UnknownTask,
     "unknown task 'no.such.task'"),
    ("task that is neither name nor handler", lambda: django_pgjobs.enqueue(42, {}),
     InvalidJobOption, "task must be a task name or a handler, not int"),
    ("django.tasks name of a module never imported",
     lambda: django_pgjobs.enqueue("django.tasks:tests.never_imported_module.x", {}),
     UnknownTask, "unknown task 'django.tasks:tests.never_imported_module.x'"),
    ("django.tasks name of something that is not a Task",
     lambda: django_pgjobs.enqueue("django.tasks:os.system", {}), UnknownTask,
     "unknown task 'django.tasks:os.system'"),
    ("unknown option", enqueue(colour="red"), InvalidJobOption,
     "unknown enqueue option(s): colour"),
    # --- queue ---
    ("empty queue", enqueue(queue=""), UnknownQueue, "queue must be a queue name"),
    ("queue with a colon", enqueue(queue="a:b"), UnknownQueue, "got 'a:b'"),
    ("queue with a NUL", enqueue(queue="a\x00b"), UnknownQueue, "queue must be a queue name"),
    ("queue with a newline", enqueue(queue="a\nb"), UnknownQueue, "got 'a\\nb'"),
    ("queue of 65 characters", enqueue(queue="q" * 65), UnknownQueue, "1 to 64"),
    ("queue that is not a string", enqueue(queue=5), UnknownQueue, "not int"),
    ("queue with a lone surrogate", enqueue(queue="q\udcff"), UnknownQueue,
     "queue must be a queue name"),
    # --- priority, attempts, version ---
    ("priority over 100", enqueue(priority=101), InvalidJobOption,
     "priority must be a whole number from -100 to 100, got 101"),
    ("priority True", enqueue(priority=True), InvalidJobOption, "got True"),
    ("priority 1.5", enqueue(priority=1.5), InvalidJobOption, "got 1.5"),
    ("priority as text", enqueue(priority="5"), InvalidJobOption, "got '5'"),
    ("max_attempts 0", enqueue(max_attempts=0), InvalidJobOption,
     "max_attempts must be a whole number from 1 to 1000000, got 0"),
    ("max_attempts 2.5", enqueue(max_attempts=2.5), InvalidJobOption, "got 2.5"),
    ("max_attempts ten million", enqueue(max_attempts=10**7), InvalidJobOption,
     "got 10000000"),
    ("payload_version 0", enqueue(payload_version=0), InvalidJobOption,
     "payload_version must be a whole number from 1 to 32767"),
    ("payload_version as text", enqueue(payload_version="1"), InvalidJobOption,
     "payload_version must be a whole number"),
    ("payload_version newer than the handler's", enqueue(payload_version=2), InvalidJobOption,
     "payload_version 2 is newer than the handler of 'tests.ok' here (version 1): no worker "
     "running this code could run the job"),
    # --- times ---
    ("naive run_at", enqueue(run_at=datetime(2030, 1, 1)), InvalidJobOption,
     "run_at is a naive datetime"),
    ("run_at as text", enqueue(run_at="2030-01-01"), InvalidJobOption,
     "run_at must be a datetime, not str"),
    ("run_at and delay", enqueue(run_at=timezone.now(), delay=1), InvalidJobOption,
     "give run_at or delay, not both"),
    ("run_at after the deadline", enqueue(run_at=LATER), InvalidJobOption,
     "is at or after the job's deadline (259200s after enqueue"),
    ("run_at after a given max_age", enqueue(run_at=timezone.now() + timedelta(hours=2),
                                             max_age=timedelta(hours=1)),
     InvalidJobOption, "is at or after the job's deadline (3600s after enqueue"),
    ("negative delay", enqueue(delay=-1), InvalidJobOption, "delay must be from 0 to"),
    ("delay 1e300", enqueue(delay=1e300), InvalidJobOption, "got 1e+300"),
    ("delay 10**20", enqueue(delay=10**20), InvalidJobOption, "delay must be from 0 to"),
    ("delay 10**400", enqueue(delay=10**400), InvalidJobOption,
     "delay must be at most 3.1536e+08 seconds, got an integer of about 401 digits"),
    ("delay timedelta.max", enqueue(delay=timedelta.max), InvalidJobOption,
     "delay must be from 0 to"),
    ("delay NaN", enqueue(delay=float("nan")), InvalidJobOption, "got nan"),
    ("delay as text", enqueue(delay="5"), InvalidJobOption,
     "delay must be a timedelta or a number of seconds, got str"),
    ("delay past the default deadline", enqueue(delay=timedelta(days=3, seconds=1)),
     InvalidJobOption, "delay of 259201s is at or after the job's deadline"),
    ("delay equal to max_age", enqueue(delay=60, max_age=60), InvalidJobOption,
     "delay of 60s is at or after the job's deadline (60s"),
    ("max_age 1e300", enqueue(max_age=1e300), InvalidJobOption, "max_age must be above 0"),
    ("max_age 0", enqueue(max_age=0), InvalidJobOption, "max_age must be above 0"),
    ("max_age negative", enqueue(max_age=timedelta(seconds=-5)), InvalidJobOption,
     "max_age must be above 0"),
    ("max_age timedelta.max", enqueue(max_age=timedelta.max), InvalidJobOption,
     "max_age must be above 0"),
    ("lease of zero", enqueue(lease=timedelta(0)), InvalidJobOption,
     "lease must be from 1 to 604800 seconds"),
    ("lease of eight days", enqueue(lease=timedelta(days=8)), InvalidJobOption,
     "lease must be from 1 to 604800 seconds"),
    ("lease as text", enqueue(lease="30"), InvalidJobOption,
     "lease must be a timedelta or a number of seconds"),
    # --- keys and labels ---
    ("empty idempotency_key", enqueue(idempotency_key=""), InvalidJobOption,
     "idempotency_key must not be empty"),
    ("idempotency_key with a NUL", enqueue(idempotency_key="k\x00"), InvalidJobOption,
     "idempotency_key contains a NUL character"),
    ("idempotency_key with a surrogate", enqueue(idempotency_key="k\udcff"), InvalidJobOption,
     "idempotency_key contains a lone surrogate"),
    ("idempotency_key of 256 characters", enqueue(idempotency_key="k" * 256),
     InvalidJobOption, "idempotency_key must be at most 255 characters"),
    ("idempotency_key that is a number", enqueue(idempotency_key=5), InvalidJobOption,
     "idempotency_key must be a string, not int"),
    ("trace_id 0", enqueue(trace_id=0), InvalidJobOption, "trace_id must be a string, not int"),
    ("trace_id False", enqueue(trace_id=False), InvalidJobOption,
     "trace_id must be a string, not bool"),
    ("trace_id []", enqueue(trace_id=[]), InvalidJobOption,
     "trace_id must be a string, not list"),
    ("trace_id with a NUL", enqueue(trace_id="t\x00"), InvalidJobOption,
     "trace_id contains a NUL character"),
    ("trace_id with a newline (a forged log line)",
     enqueue(trace_id="t1\n2026-01-01 INFO job.succeeded id=1"), InvalidJobOption,
     "trace_id must not contain control characters"),
    ("trace_id of 65 characters", enqueue(trace_id="t" * 65), InvalidJobOption,
     "trace_id must be at most 64 characters"),
    ("empty fairness_key", enqueue(fairness_key=""), InvalidJobOption,
     "fairness_key must not be empty"),
    ("fairness_key with a NUL", enqueue(fairness_key="f\x00"), InvalidJobOption,
     "fairness_key contains a NUL character"),
    ("fairness_key with a surrogate", enqueue(fairness_key="\ud800"), InvalidJobOption,
     "fairness_key contains a lone surrogate"),
    # --- databases and bulk ---
    ("unknown database", enqueue(using="other"), InvalidJobOption,
     "using must name a database in DATABASES, got 'other'"),
    ("database alias that is not a string", enqueue(using=3), InvalidJobOption,
     "using must name a database in DATABASES, got 3"),
    ("database alias of a SQLite database", enqueue(using="lite"), InvalidJobOption,
     "using names database 'lite', which uses sqlite; django-pgjobs stores jobs in "
     "PostgreSQL only"),
    ("a JobSpec choosing its database",
     lambda: django_pgjobs.enqueue_many([JobSpec.of("tests.ok", {}, using="default")]),
     InvalidJobOption, "a JobSpec cannot choose its database"),
    ("enqueue_many of something that is not a JobSpec",
     lambda: django_pgjobs.enqueue_many([("tests.ok", {})]), InvalidJobOption,
     "enqueue_many takes JobSpec objects"),
    ("one bad spec among good ones",
     lambda: django_pgjobs.enqueue_many([JobSpec.of("tests.ok", {"i": i}) for i in range(3)]
                                        + [JobSpec.of("tests.ok", {"i": object()})]),
     PayloadNotJSON, "payload['i']: object is not JSON"),
    ("a bad spec first", lambda: django_pgjobs.enqueue_many(
        [JobSpec.of("tests.ok", {}, priority=500), JobSpec.of("tests.ok", {})]),
     InvalidJobOption, "priority must be a whole number"),
    # --- a handler's own enqueue ---
    ("handler.enqueue with a bad queue", lambda: ok.enqueue({}, queue="no spaces please"),
     UnknownQueue, "got 'no spaces please'"),
    ("handler.enqueue with a payload that is not JSON", lambda: ok.enqueue({"at": timezone}),
     PayloadNotJSON, "payload['at']: module is not JSON"),
    # --- the django.tasks backend ---
    ("task argument with an integer key", lambda: remember.enqueue({1: "x"}), PayloadNotJSON,
     "payload['args'][0]: key 1 is a int"),
    ("task argument with a lone surrogate", lambda: remember.enqueue("bad \udcff"),
     PayloadNotJSON, "payload['args'][0]: contains a lone surrogate"),
    ("task argument with a NUL", lambda: remember.enqueue("x", detail={"n": "a\x00"}),
     PayloadNotJSON, "payload['kwargs']['detail']['n']: contains a NUL character"),
    ("task arguments over the size limit", lambda: remember.enqueue("x" * 70_000),
     PayloadTooLarge, "over the 65536-byte limit"),
    ("task argument 10,000 levels deep", lambda: remember.enqueue("x", detail=deep(10_000)),
     PayloadNotJSON, "not JSON at payload['kwargs']: nested more than 32 levels deep "
     "(PGJOBS_MAX_PAYLOAD_DEPTH)"),
    ("task argument 31 levels deep, 33 in the payload",
     lambda: remember.enqueue(deep(31, "dict")), PayloadNotJSON, "nested more than 32 levels"),
    ("task on a queue name enqueue refuses", lambda: remember.using(queue_name="a b").enqueue("x"),
     InvalidJobOption, "Queue 'a b' is not valid for backend: the queue must be a queue name"),
]


def test_the_catalogue_covers_at_least_sixty_kinds_of_bad_input() -> None:
    assert len(CATALOGUE) >= 60
    assert len({name for name, *_ in CATALOGUE}) == len(CATALOGUE)


@pytest.fixture
def lite_database() -> Iterator[None]:
    """A SQLite database "lite" beside the PostgreSQL one; nothing is ever sent to it."""
    connections.settings["lite"] = connections.configure_settings({
        DEFAULT_DB_ALIAS: dict(connections.settings[DEFAULT_DB_ALIAS]),
        "lite": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
    })["lite"]
    try:
        yield
    finally:
        with suppress(AttributeError):  # its wrapper exists once a test has used it
            del connections["lite"]
        del connections.settings["lite"]


@pytest.mark.parametrize(("call", "error", "message"), [entry[1:] for entry in CATALOGUE],
                         ids=[entry[0] for entry in CATALOGUE])
@pytest.mark.usefixtures("lite_database")
def test_bad_input_is_refused_before_any_sql_and_the_transaction_goes_on(
    call: Callable[[], Any], error: type[Exception], message: str
) -> None:
    with transaction.atomic():
        with CaptureQueriesContext(connection) as queries, pytest.raises(error) as raised:
            call()
        assert isinstance(raised.value, EnqueueError)
        assert message in str(raised.value), str(raised.value)
        assert queries.captured_queries == []  # refused before anything reached PostgreSQL
        # The caller's transaction is still usable: the next statement and enqueue work.
        assert Job.objects.count() == 0
        django_pgjobs.enqueue("tests.ok", {"after": True})
    assert list(Job.objects.values_list("payload", flat=True)) == [{"after": True}]


def test_declared_queues_refuse_others_before_any_sql(settings) -> None:
    settings.PGJOBS_QUEUES = ["default"]
    with CaptureQueriesContext(connection) as queries, pytest.raises(UnknownQueue,
                                                                     match="unknown queue"):
        django_pgjobs.enqueue("tests.ok", {}, queue="emails")
    assert queries.captured_queries == []
    assert Job.objects.count() == 0


def test_the_payload_depth_follows_the_setting(settings) -> None:
    settings.PGJOBS_MAX_PAYLOAD_DEPTH = 3
    django_pgjobs.enqueue("tests.ok", deep(3))
    with pytest.raises(PayloadNotJSON, match="nested more than 3 levels"):
        django_pgjobs.enqueue("tests.ok", deep(4))
    assert Job.objects.count() == 1


# --- what the commands print --------------------------------------------------------------------


def test_the_queue_listing_prints_a_pause_reason_escaped_on_its_own_line() -> None:
    forged = "deploy\nother                    running ready=0 running=0\x1b[2J"
    transitions.pause_queue("mail", actor=transitions.Actor("ops\r"), reason=forged)
    out = StringIO()
    call_command("pgjobs_queue", "list", stdout=out)
    [line] = out.getvalue().splitlines()
    assert line.startswith("mail                     PAUSED  ready=0 running=0 oldest_ready=- ")
    assert line.endswith(" by ops\\r: deploy\\nother                    running ready=0 "
                         "running=0\\x1b[2J)")
    assert "\x1b" not in out.getvalue()


@pytest.mark.parametrize("given", [{"poll_interval": 1e-300}, {"poll_interval": 0.0}, {}])
def test_a_worker_refuses_a_poll_interval_under_the_floor_from_its_caller_or_the_setting(
    settings, given: dict[str, float]
) -> None:
    from django_pgjobs.worker import Worker

    settings.PGJOBS_POLL_INTERVAL_SECONDS = 1e-300  # a process that skipped the checks
    value = given.get("poll_interval", 1e-300)
    with pytest.raises(ValueError) as refused:
        Worker(install_signals=False, maintenance=[], **given)
    assert str(refused.value) == (
        f"poll_interval must be a finite number from 0.01 to 3600, got {value!r}")


# --- settings a process that skipped the checks meets at enqueue ------------------------------


@pytest.mark.parametrize(("name", "value", "message"), [
    ("LEASE_SECONDS", -5, "PGJOBS_LEASE_SECONDS must be a whole number from 1 to 604800, got -5 "
     "(manage.py check reports it as pgjobs.E010)"),
    ("MAX_ATTEMPTS", 0, "PGJOBS_MAX_ATTEMPTS must be a whole number from 1 to 1000000, got 0"),
    ("MAX_AGE_SECONDS", float("nan"), "PGJOBS_MAX_AGE_SECONDS must be a finite number above 0"),
    ("MAX_PAYLOAD_BYTES", 0, "PGJOBS_MAX_PAYLOAD_BYTES must be a whole number from 1 to"),
    ("QUEUE", "a b", "PGJOBS_QUEUE must be a queue name"),
    ("NOTIFY", "yes", "PGJOBS_NOTIFY must be True or False, got 'yes'"),
])
def test_a_setting_the_checks_refuse_is_refused_at_enqueue_before_any_sql(
    settings, name: str, value: Any, message: str
) -> None:
    setattr(settings, f"PGJOBS_{name}", value)
    with transaction.atomic():
        with CaptureQueriesContext(connection) as queries, pytest.raises(InvalidSetting) as raised:
            django_pgjobs.enqueue("tests.ok", {"card_number": "4111111111111111"})
        assert str(raised.value).startswith(message), str(raised.value)
        assert raised.value.setting == f"PGJOBS_{name}"
        assert queries.captured_queries == []
        assert Job.objects.count() == 0
    delattr(settings, f"PGJOBS_{name}")
    assert django_pgjobs.enqueue("tests.ok", {}).pk is not None


# --- a database enqueue cannot write to ---------------------------------------------------------


def test_an_unmigrated_database_is_a_named_error_that_leaves_the_callers_transaction_usable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(enqueuing, "_migrated", set())  # as in a process that just started
    with transaction.atomic():
        with connection.cursor() as cursor:
            # The database as it is before migrate: no job table where the connection looks.
            cursor.execute("CREATE SCHEMA pgjobs_unmigrated")
            cursor.execute("SET LOCAL search_path = pgjobs_unmigrated")
            cursor.execute("CREATE TABLE orders (id int)")
            cursor.execute("INSERT INTO orders VALUES (1)")
        for _ in range(2):  # not known to be migrated: every try is refused alike
            with pytest.raises(NotMigrated) as refused:
                django_pgjobs.enqueue("tests.ok", {})
            assert str(refused.value) == (
                "database 'default' has not been migrated for django-pgjobs (no pgjobs_job "
                "table, or an older one): run manage.py migrate --database default")
        with connection.cursor() as cursor:  # the caller's transaction goes on
            cursor.execute("SELECT count(*) FROM orders")
            assert cursor.fetchone() == (1,)
        transaction.set_rollback(True)
    assert enqueuing._migrated == set()
    django_pgjobs.enqueue("tests.ok", {})
    assert enqueuing._migrated == {"default"}


def test_a_single_enqueue_on_a_migrated_database_is_one_statement_inside_a_transaction() -> None:
    django_pgjobs.enqueue("tests.ok", {"first": True})  # the alias is known to be migrated now
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        django_pgjobs.enqueue("tests.ok", {"second": True})
    [statement] = queries.captured_queries
    assert "INSERT INTO pgjobs_job" in statement["sql"]
