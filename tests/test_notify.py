"""LISTEN/NOTIFY wake-ups: the listener thread, reconnects, and poll-only workers."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from django.db import connection, transaction

import django_pgjobs
from django_pgjobs.models import Job
from django_pgjobs.notify import Listener
from django_pgjobs.status import JobStatus
from django_pgjobs.worker import Worker
from tests.conftest import run_in_thread, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

APP_NAME = "pgjobs-listener test"


class Wakes:
    """Counts wake() calls and lets a test wait for the next one."""

    def __init__(self) -> None:
        self.count = 0
        self._cond = threading.Condition()

    def __call__(self) -> None:
        with self._cond:
            self.count += 1
            self._cond.notify_all()

    def wait_beyond(self, count: int, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.count > count, timeout)


@pytest.fixture
def listener() -> Iterator[tuple[Listener, Wakes]]:
    wakes = Wakes()
    started = Listener(wakes, queues={"default", "billing"}, application_name=APP_NAME)
    started.start()
    try:
        assert started.listening.wait(10)
        assert wakes.wait_beyond(0, 10)  # the catch-up wake after (re)connecting
        yield started, wakes
    finally:
        started.stop()
    assert not started.is_alive()


def listener_backends(application_name: str = APP_NAME) -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity "
                       "WHERE datname = current_database() AND application_name = %s",
                       [application_name])
        return [row[0] for row in cursor.fetchall()]


def test_a_committed_enqueue_wakes_the_listener_and_a_rolled_back_one_does_not(
    listener: tuple[Listener, Wakes],
) -> None:
    _, wakes = listener
    before = wakes.count
    with transaction.atomic():
        django_pgjobs.enqueue("tests.ok", {"n": 1})
        # Nothing is delivered before the enqueuing transaction commits.
        assert not wakes.wait_beyond(before, 0.3)
    assert wakes.wait_beyond(before, 10)
    after_commit = wakes.count

    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        django_pgjobs.enqueue("tests.ok", {"n": 2})
        raise Abort
    assert not wakes.wait_beyond(after_commit, 0.5)
    assert wakes.count == after_commit


def test_the_listener_ignores_queues_its_worker_does_not_serve(
    listener: tuple[Listener, Wakes],
) -> None:
    _, wakes = listener
    before = wakes.count
    django_pgjobs.enqueue("tests.ok", {"n": 1}, queue="reports")
    assert not wakes.wait_beyond(before, 0.5)
    django_pgjobs.enqueue("tests.ok", {"n": 2}, queue="billing")
    assert wakes.wait_beyond(before, 10)
    assert wakes.count == before + 1


def test_a_scheduled_job_sends_no_notification(listener: tuple[Listener, Wakes]) -> None:
    _, wakes = listener
    before = wakes.count
    django_pgjobs.enqueue("tests.ok", {"n": 1}, delay=3600)
    assert not wakes.wait_beyond(before, 0.5)


def test_the_listener_reconnects_after_losing_its_connection(
    listener: tuple[Listener, Wakes],
) -> None:
    started, wakes = listener
    [pid] = listener_backends()
    before = wakes.count
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    # It reconnects, LISTENs again and wakes the worker once for whatever it may have missed.
    assert wakes.wait_beyond(before, 15)
    wait_for(lambda: started.listening.is_set() and listener_backends(), timeout=15)
    assert started.reconnects == 1
    new_pid = listener_backends()
    assert new_pid != [pid] and len(new_pid) == 1
    after = wakes.count
    django_pgjobs.enqueue("tests.ok", {"n": 1})
    assert wakes.wait_beyond(after, 10)


def test_an_idle_worker_takes_a_new_job_on_notify_long_before_its_next_poll() -> None:
    # A 60 s poll: without the notification the job would wait about a minute.
    worker = Worker(poll_interval=60, install_signals=False, maintenance=[])
    thread = run_in_thread(worker)
    try:
        wait_for(lambda: worker._listener is not None and worker._listener.listening.is_set(),
                 timeout=10)
        assert len(listener_backends(f"pgjobs-listener {worker.worker_id}"[:63])) == 1
        time.sleep(0.3)  # the executor's first claim finds nothing and it goes idle
        job = django_pgjobs.enqueue("tests.ok", {"n": 1})
        wait_for(lambda: Job.objects.get(pk=job.pk).status == JobStatus.SUCCEEDED, timeout=10)
    finally:
        worker.stop()
        thread.join(10)
    assert worker.counters.claimed == 1


def test_a_poll_only_worker_opens_no_listening_connection_and_still_runs_jobs() -> None:
    worker = Worker(poll_interval=0.05, install_signals=False, maintenance=[], listen=False)
    thread = run_in_thread(worker)
    try:
        job = django_pgjobs.enqueue("tests.ok", {"n": 1})
        wait_for(lambda: Job.objects.get(pk=job.pk).status == JobStatus.SUCCEEDED, timeout=10)
        assert listener_backends(f"pgjobs-listener {worker.worker_id}"[:63]) == []
        assert worker._listener is None
    finally:
        worker.stop()
        thread.join(10)


def test_without_a_listener_an_idle_worker_waits_for_its_poll() -> None:
    # The control for the wake-up test: the same idle worker, poll-only, leaves the job alone.
    worker = Worker(poll_interval=60, install_signals=False, maintenance=[], listen=False)
    thread = run_in_thread(worker)
    try:
        time.sleep(0.3)
        job = django_pgjobs.enqueue("tests.ok", {"n": 1})
        time.sleep(1.0)
        assert Job.objects.get(pk=job.pk).status == JobStatus.READY
    finally:
        worker.stop()
        thread.join(10)
