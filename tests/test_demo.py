"""The demo a newcomer runs first (``make demo``), the admin it points to (``make admin``), and
the demo's handlers, tested with django_pgjobs.testing."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

import django_pgjobs
from django_pgjobs.models import Job
from django_pgjobs.status import TERMINAL_STATUSES
from django_pgjobs.testing import ANY
from testproject.demo.management.commands.run_demo import Command as RunDemo
from testproject.demo.models import LedgerEntry, Order
from testproject.demo.tasks import add
from tests.conftest import MANAGE, ROOT, worker_env


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_demo_drains_its_workload_and_leaves_two_admin_users(monkeypatch) -> None:
    # The demo's worker processes connect to the test database, as the suite's do.
    for name, value in worker_env().items():
        monkeypatch.setenv(name, value)
    out = StringIO()
    call_command("run_demo", "--jobs", "600", "--workers", "2", stdout=out)
    summary = out.getvalue()

    assert Job.objects.count() > 0
    assert Job.objects.exclude(status__in=TERMINAL_STATUSES).count() == 0
    assert "NOT FINISHED" not in summary
    assert "0 duplicate charges (receipted)" in summary
    assert "killed worker demo-0-0 (SIGKILL)" in summary
    # The exports ran under their limit of one per customer, and all of them finished.
    assert ("exports: 60 of 60 done for 3 customers under a limit of 1 per customer; most of one "
            "customer's running at once: 1") in summary
    # Its workflows ran through the kill: every callback, and no job before its dependencies.
    assert ("workflows: 5 chords of 10 (callbacks run: 5) and 10 chains of 4; 80 edges waited "
            "on, 0 of them started before their dependency ended") in summary
    # Its card payments ran through the kill too, their card numbers never stored in plaintext.
    assert ("card payments: 20 of 20 done; card numbers and authorizations found in plaintext "
            "in the job table: 0") in summary
    assert "run `make admin`, then open http://127.0.0.1:8000/admin/pgjobs/job/" in summary

    charge = Job.objects.filter(task="demo.charge").first()
    assert charge is not None and charge.payload["card"]["number"] == "4242424242424242"
    viewer, superuser = Client(), Client()
    assert viewer.login(username="viewer", password="viewer")
    assert superuser.login(username="demo", password="demo")
    page = viewer.get(f"/admin/pgjobs/job/{charge.pk}/change/")
    assert page.status_code == 200
    assert b"4242424242424242" not in page.content and b"[redacted]" in page.content
    actions = {name for name, _ in viewer.get("/admin/pgjobs/job/")
               .context["action_form"].fields["action"].choices if name}
    assert actions == {"export_selected"}
    assert "retry_selected" in {name for name, _ in superuser.get("/admin/pgjobs/job/")
                                .context["action_form"].fields["action"].choices}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_admin_server_of_make_admin_serves_the_admin_and_its_styles() -> None:
    port = free_port()
    # The command `make admin` runs, on a free port.
    server = subprocess.Popen(
        [sys.executable, str(MANAGE), "runserver", "--insecure", "--noreload",
         f"127.0.0.1:{port}"],
        cwd=ROOT, env=worker_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                login = urllib.request.urlopen(f"http://127.0.0.1:{port}/admin/login/", timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise
                time.sleep(0.2)
        assert login.status == 200
        assert b"Django administration" in login.read()
        css = urllib.request.urlopen(f"http://127.0.0.1:{port}/static/admin/css/base.css",
                                     timeout=5)
        assert css.status == 200
    finally:
        server.terminate()
        server.wait(30)


# --- the demo's handlers, tested with django_pgjobs.testing (as an application would) ----------


def test_the_demo_workload_is_what_its_summary_counts(pgjobs) -> None:
    total = RunDemo()._enqueue(200)
    charges = pgjobs.enqueued_jobs("demo.charge")
    # One charge per order: the replayed enqueues found their idempotency keys taken.
    assert len(charges) == Order.objects.count() == 10
    pgjobs.assert_enqueued("demo.charge", payload={"card": {"number": "4242424242424242"}},
                           idempotency_key=ANY)
    assert len(pgjobs.enqueued_jobs("demo.long")) == 4
    assert len(pgjobs.enqueued_jobs()) == total


def test_a_flaky_job_succeeds_on_the_attempt_after_its_failures(pgjobs) -> None:
    job = django_pgjobs.enqueue("demo.flaky", {"failures": 2})
    # Each retry's backoff has passed by then: the three attempts run in one drain.
    runs = pgjobs.drain(now=timezone.now() + timedelta(minutes=5))
    assert [(r.attempt, r.outcome) for r in runs] == [
        (1, "failed"), (2, "failed"), (3, "succeeded")]
    assert runs[-1].result == "ok" and runs[0].failure_class == "transient"
    assert Job.objects.get(pk=job.pk).attempts == 3


def test_a_charge_enqueued_twice_charges_once(pgjobs) -> None:
    order = Order.objects.create(reference="ORD-1", amount_cents=500)
    django_pgjobs.enqueue("demo.charge", {"order_id": order.pk})
    django_pgjobs.enqueue("demo.charge", {"order_id": order.pk})
    runs = pgjobs.drain()
    assert [r.result for r in runs] == [{"charged_cents": 500}] * 2
    assert LedgerEntry.objects.filter(kind="charge", key=str(order.pk)).count() == 1


@pytest.mark.parametrize(("task", "error"), [
    ("demo.invalid", "has no line items"),
    ("demo.permission", "the API key was revoked"),
    ("demo.bad_return", "handler returned a value that is not JSON"),
])
def test_permanent_failures_are_dead_after_one_attempt(pgjobs, task, error) -> None:
    django_pgjobs.enqueue(task, {"order": 1})
    [run] = pgjobs.drain()
    assert (run.outcome, run.status, run.failure_class) == ("dead", "dead", "permanent")
    assert error in run.error


def test_the_demo_task_runs_through_the_backend(pgjobs) -> None:
    result = add.enqueue(40, 2)
    pgjobs.assert_enqueued(add, args=[40, 2])
    [run] = pgjobs.drain()
    assert run.result == 42 == add.get_result(result.id).return_value
