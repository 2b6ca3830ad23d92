"""The demo a newcomer runs first (``make demo``), and the admin it points to (``make admin``)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from io import StringIO

import pytest
from django.core.management import call_command
from django.test import Client

from django_pgjobs.models import Job
from django_pgjobs.status import TERMINAL_STATUSES
from tests.conftest import MANAGE, ROOT, worker_env

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


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
