"""The operator console: the worker processes' heartbeat rows (which workers are live, which
queues with ready jobs none of them serves), errors grouped, the dead list's reasons, actions on
a job's own page, and records that link what they name."""

from __future__ import annotations

import json
import re
import signal
import time
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command

import django_pgjobs
from django_pgjobs import stats
from django_pgjobs.models import Job, WorkerProcess
from django_pgjobs.workers import Heartbeat
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db

DASHBOARD = "/admin/pgjobs/job/dashboard/"


def beat(worker_id: str = "w1", queues: list[str] | None = None, running: int = 0,
         listens: bool = False) -> Heartbeat:
    heartbeat = Heartbeat(worker_id, queues=queues, concurrency=4, listens=listens,
                          running=lambda: running)
    heartbeat()
    return heartbeat


def test_a_heartbeat_writes_the_workers_row_and_a_stop_says_so() -> None:
    heartbeat = beat(queues=["mail", "default"], running=2)
    row = WorkerProcess.objects.get()
    assert (row.worker_id, row.queues, row.concurrency, row.running, row.stopped_at) == (
        "w1", ["default", "mail"], 4, 2, None)
    assert row.pid > 0 and row.host
    [w] = stats.workers()
    assert (w.state, w.queues, w.serves("mail"), w.serves("other")) == (
        "live", ["default", "mail"], True, False)
    heartbeat.stopped()
    [w] = stats.workers()
    assert w.state == "stopped"


def test_a_worker_not_seen_for_two_heartbeats_is_gone() -> None:
    beat()
    WorkerProcess.objects.update(last_seen_at=WorkerProcess.objects.get().last_seen_at
                                 - _seconds(11))
    [w] = stats.workers()
    assert w.state == "gone"


def test_a_listening_workers_row_without_its_session_is_gone() -> None:
    beat(listens=True)
    # Started more than two seconds ago and its listening session is nowhere: gone, however
    # fresh its heartbeat.
    WorkerProcess.objects.update(started_at=WorkerProcess.objects.get().started_at - _seconds(3))
    [w] = stats.workers()
    assert w.state == "gone"


def test_the_dashboard_names_a_queue_with_ready_jobs_that_no_live_worker_serves(login) -> None:
    beat("w1", queues=["mail"])
    django_pgjobs.enqueue("demo.noop", {}, queue="reports")
    django_pgjobs.enqueue("demo.noop", {}, queue="mail")
    page = login("view_job").get(DASHBOARD).content.decode()
    health = page.split('id="pgjobs-health"', 1)[1].split("</div>", 1)[0]
    assert "Queue reports has 1 job ready and no live worker serving it" in health
    assert "Queue mail" not in health
    assert 'id="pgjobs-workers"' in page and "w1" in page
    assert stats.snapshot().as_dict()["unserved_queues"] == ["reports"]


def test_with_every_queue_served_the_dashboard_says_how_many_workers_are_live(login) -> None:
    beat("w1")
    django_pgjobs.enqueue("demo.noop", {})
    page = login("view_job").get(DASHBOARD).content.decode()
    assert "1 live worker serving every queue with ready jobs" in page


def test_the_workers_page_needs_its_view_permission_and_lists_each_state(login) -> None:
    beat("alive")
    beat("stopped-one").stopped()
    assert login("view_job").get("/admin/pgjobs/workerprocess/").status_code == 403
    page = login("view_workerprocess", username="viewer").get(
        "/admin/pgjobs/workerprocess/").content.decode()
    table = page.split('id="pgjobs-workers"', 1)[1]
    assert table.index("alive") < table.index("stopped-one")
    assert ">stopped<" in table


def test_pgjobs_stats_lists_the_workers_and_the_unserved_queues() -> None:
    beat("w1", queues=["mail"])
    django_pgjobs.enqueue("demo.noop", {}, queue="reports")
    out = StringIO()
    call_command("pgjobs_stats", stdout=out)
    text = out.getvalue()
    assert "Workers (live first)" in text and "w1" in text
    assert "UNSERVED: reports" in text
    out = StringIO()
    call_command("pgjobs_stats", "--json", stdout=out)
    assert json.loads(out.getvalue())["unserved_queues"] == ["reports"]


def test_the_metrics_count_workers_by_state() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from django_pgjobs.metrics import StatsCollector

    beat("w1")
    beat("w2").stopped()
    registry = CollectorRegistry()
    registry.register(StatsCollector())
    text = generate_latest(registry).decode()
    assert 'pgjobs_workers{state="live"} 1.0' in text
    assert 'pgjobs_workers{state="stopped"} 1.0' in text


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_killing_the_only_worker_of_a_queue_makes_the_dashboard_name_it_at_once(
    start_worker, login,
) -> None:
    from django.conf import settings

    worker = start_worker("--worker-id", "only", "--queue", "q1", "--concurrency", "1",
                          "--batch-size", "1")
    # Busy with a long job, so the next one waits ready.
    django_pgjobs.enqueue("demo.export", {"customer": "a", "seconds": 60}, queue="q1")
    wait_for(lambda: Job.objects.filter(status="running").exists(), 30)
    django_pgjobs.enqueue("demo.noop", {}, queue="q1")
    client = login("view_job")
    time.sleep(2.5)  # a listening worker is judged by its session once it has had time to open it

    def health() -> str:
        page = client.get(DASHBOARD).content.decode()
        return page.split('id="pgjobs-health"', 1)[1].split("</div>", 1)[0]

    assert "Queue q1" not in health()
    worker.signal(signal.SIGKILL)
    worker.wait(10)
    killed = time.monotonic()
    heartbeat = float(getattr(settings, "PGJOBS_WORKER_HEARTBEAT_SECONDS", 5.0))
    wait_for(lambda: re.search(r"Queue q1 has \d+ jobs? ready and no live worker serving it: "
                               r"no worker is live", health()), heartbeat)
    # Within one heartbeat interval: its session ended with it.
    assert time.monotonic() - killed < heartbeat


def _seconds(n: float) -> timedelta:
    return timedelta(seconds=n)


# --- failures grouped, and the dead list's reasons -----------------------------------------------


def fail(task: str, error: str) -> Job:
    from tests.factories import AttemptFactory, JobFactory

    job = JobFactory(task=task, dead=True, failure_class="permanent",
                     terminal_reason="permanent_error", last_error=error)
    AttemptFactory(job=job, outcome="failed", failure_class="permanent", error=error)
    return job


def test_errors_that_read_alike_but_for_numbers_and_ids_are_one_group(login) -> None:
    for n in (4711, 4712, 4713):
        fail("demo.noop", f"order {n} not found (request 9f1c2e3a-0b1c-4d2e-8f00-1234567890ab)")
    fail("demo.noop", "card declined")
    [first, second] = stats.error_groups()
    assert (first.task, first.failure_class, first.count) == ("demo.noop", "permanent", 3)
    assert first.message == "order N not found (request <id>)"
    assert (second.message, second.count) == ("card declined", 1)
    page = login("view_job").get(DASHBOARD).content.decode()
    table = page.split('id="pgjobs-error-groups"', 1)[1].split("</table>", 1)[0]
    assert "order N not found (request &lt;id&gt;)" in table
    assert "task=demo.noop&amp;failure_class__exact=permanent" in table


def test_a_grouped_error_shows_no_secret_to_a_viewer(login) -> None:
    fail("demo.noop", "login failed: password=hunter2 for user ada")
    page = login("view_job").get(DASHBOARD).content.decode()
    table = page.split('id="pgjobs-error-groups"', 1)[1].split("</table>", 1)[0]
    assert "hunter2" not in table and "login failed" in table


def test_the_dead_list_says_each_jobs_terminal_reason_and_last_error(login) -> None:
    fail("demo.noop", "order 1 not found\nTraceback (most recent call last): ...")
    client = login("view_job")
    page = client.get("/admin/pgjobs/job/?status__exact=dead").content.decode()
    assert "column-reason_shown" in page and "column-error_preview" in page
    assert "permanent error" in page
    assert "order 1 not found" in page and "Traceback" not in page
    assert "column-error_preview" not in client.get("/admin/pgjobs/job/").content.decode()


# --- acting on the job's own page -----------------------------------------------------------------


def test_a_job_waiting_out_its_backoff_can_be_run_now_from_its_page(login) -> None:
    from django.utils import timezone

    from django_pgjobs.models import OperatorAction
    from tests.factories import JobFactory

    job = JobFactory(retrying=True, run_at=timezone.now() + timedelta(minutes=10),
                     failure_class="permanent")
    client = login("view_job", "retry_job", superuser=False)
    page = client.get(f"/admin/pgjobs/job/{job.pk}/change/").content.decode()
    form = page.split('id="pgjobs-job-actions"', 1)[1].split("</form>", 1)[0]
    # Only what this job's state allows and this user may do.
    assert 'value="run_now_selected"' in form
    assert 'value="retry_selected"' not in form and 'value="cancel_selected"' not in form
    plan = client.post("/admin/pgjobs/job/", {"action": "run_now_selected", "index": 0,
                                              "_selected_action": job.pk}).content.decode()
    assert "will be due now instead of at their time" in plan
    assert "last failed with a permanent error and will likely fail again" in plan
    done = client.post("/admin/pgjobs/job/", {
        "action": "run_now_selected", "_selected_action": job.pk, "pgjobs_confirm": "yes",
        "pgjobs_ids": str(job.pk), "reason": "fixed the API key"})
    assert done.status_code == 302
    job.refresh_from_db()
    assert job.status == "ready" and job.run_at <= timezone.now()
    action = OperatorAction.objects.get()
    assert (action.action, action.reason, action.changed) == ("run_now", "fixed the API key", 1)


def test_a_view_only_user_sees_no_action_on_a_jobs_page(login) -> None:
    from tests.factories import JobFactory

    job = JobFactory(dead=True)
    page = login("view_job").get(f"/admin/pgjobs/job/{job.pk}/change/").content.decode()
    assert 'id="pgjobs-job-actions"' not in page
    page = login("view_job", "retry_job", "replay_job", username="op2").get(
        f"/admin/pgjobs/job/{job.pk}/change/").content.decode()
    form = page.split('id="pgjobs-job-actions"', 1)[1].split("</form>", 1)[0]
    assert 'value="retry_selected"' in form and 'value="replay_selected"' in form
    assert 'value="run_now_selected"' not in form


def test_run_now_leaves_jobs_not_waiting_for_a_time_as_they_are() -> None:
    from django_pgjobs.transitions import run_jobs_now
    from tests.factories import JobFactory

    ready, running, dead = JobFactory(), JobFactory(running=True), JobFactory(dead=True)
    assert run_jobs_now([ready.pk, running.pk, dead.pk]) == 0
    assert [Job.objects.get(pk=j.pk).status for j in (ready, running, dead)] == [
        "ready", "running", "dead"]


# --- records link the records they name -----------------------------------------------------------


def test_the_audit_list_names_each_actions_target_with_links(login) -> None:
    from django_pgjobs.transitions import cancel_jobs, pause_queue, set_key_limit
    from tests.factories import JobFactory

    jobs = [JobFactory() for _ in range(5)]
    cancel_jobs([j.pk for j in jobs], reason="bad batch")
    pause_queue("mail")
    set_key_limit("tests.limited:acme", 3)
    page = login("view_operatoraction").get("/admin/pgjobs/operatoraction/").content.decode()
    assert f'<a href="/admin/pgjobs/job/{jobs[0].pk}/change/">job {jobs[0].pk}</a>' in page
    assert "and 2 more" in page
    assert "queue mail" in page and "key tests.limited:acme" in page


def test_a_receipt_links_its_job_and_says_when_the_job_is_pruned(login) -> None:
    from django_pgjobs.models import IdempotencyReceipt
    from tests.factories import JobFactory

    job = JobFactory()
    IdempotencyReceipt.objects.create(scope="charge", key="o-1", job_id=job.pk, result={},
                                      expires_at=job.created_at)
    IdempotencyReceipt.objects.create(scope="charge", key="o-2", job_id=999_999, result={},
                                      expires_at=job.created_at)
    page = login("view_idempotencyreceipt").get(
        "/admin/pgjobs/idempotencyreceipt/").content.decode()
    assert f'<a href="/admin/pgjobs/job/{job.pk}/change/">job {job.pk}</a>' in page
    assert "999999 (pruned)" in page


def test_a_jobs_page_links_the_receipts_its_attempts_took(login) -> None:
    from django_pgjobs.models import IdempotencyReceipt
    from tests.factories import JobFactory

    job, other = JobFactory(), JobFactory()
    took = [IdempotencyReceipt.objects.create(scope="charge", key=f"o-{n}", job_id=job.pk,
                                              result={}, expires_at=job.created_at)
            for n in range(2)]
    IdempotencyReceipt.objects.create(scope="mail", key="m-1", job_id=other.pk, result={},
                                      expires_at=job.created_at)
    page = login("view_job", username="no-receipts").get(
        f"/admin/pgjobs/job/{job.pk}/change/").content.decode()
    assert "charge:o-0" not in page  # receipts are for those who may see receipts
    client = login("view_job", "view_idempotencyreceipt")
    page = client.get(f"/admin/pgjobs/job/{job.pk}/change/").content.decode()
    for receipt in took:
        assert (f'<a href="/admin/pgjobs/idempotencyreceipt/{receipt.pk}/change/">'
                f"charge:{receipt.key}</a>") in page
    assert "mail:m-1" not in page
    alone = client.get(f"/admin/pgjobs/job/{other.pk}/change/").content.decode()
    assert "mail:m-1" in alone and "charge:o-0" not in alone


def test_the_audit_list_filters_by_actor_and_by_time(login) -> None:
    from django_pgjobs.models import OperatorAction
    from django_pgjobs.transitions import Actor, pause_queue, resume_queue

    pause_queue("mail", actor=Actor("ada"))
    resume_queue("mail", actor=Actor("bob"))
    old = OperatorAction.objects.get(actor_name="bob")
    OperatorAction.objects.filter(pk=old.pk).update(created_at=old.created_at - _seconds(86400))
    client = login("view_operatoraction", username="carol")

    def rows(query: str) -> str:
        page = client.get(f"/admin/pgjobs/operatoraction/?{query}").content.decode()
        return page.split('id="result_list"', 1)[1].split("</table>", 1)[0]

    assert "ada" in rows("actor=ada") and "bob" not in rows("actor=ada")
    assert "ada" in rows("when=1h") and "bob" not in rows("when=1h")
    assert "ada" in rows("when=7d") and "bob" in rows("when=7d")
    # The actor choices are the staff users, never a DISTINCT over the log.
    cl = client.get("/admin/pgjobs/operatoraction/").context["cl"]
    [actors] = [spec for spec in cl.filter_specs if spec.title == "actor"]
    assert [c["display"] for c in actors.choices(cl)] == ["All", "carol"]


def test_the_job_list_filters_jobs_by_when_they_finished(login) -> None:
    from django.utils import timezone

    from tests.factories import JobFactory

    now = timezone.now()
    recent = JobFactory(dead=True, finished_at=now - _seconds(600))
    today = JobFactory(succeeded=True, finished_at=now - _seconds(5 * 3600))
    JobFactory(succeeded=True, finished_at=now - _seconds(9 * 86400))
    JobFactory()  # not finished
    client = login("view_job")

    def listed(value: str) -> set[int]:
        response = client.get("/admin/pgjobs/job/", {"finished": value})
        return {j.pk for j in response.context["cl"].result_list}

    assert listed("1h") == {recent.pk}
    assert listed("24h") == {recent.pk, today.pk}
    assert listed("7d") == {recent.pk, today.pk}
    assert listed("1y") == set()  # not a range the filter offers


def test_a_plan_names_the_tasks_it_will_act_on_the_most_jobs_first(login, monkeypatch) -> None:
    from tests.factories import JobFactory

    monkeypatch.setattr("django_pgjobs.admin.actions.PLAN_TASKS_SHOWN", 2)
    jobs = [*JobFactory.create_batch(3, task="demo.charge", dead=True),
            JobFactory(task="demo.noop", dead=True), JobFactory(task="demo.work", dead=True),
            JobFactory(task="demo.flaky", dead=True)]
    client = login("view_job", "retry_job")
    plan = client.post("/admin/pgjobs/job/", {
        "action": "retry_selected", "index": 0,
        "_selected_action": [j.pk for j in jobs]}).content.decode()
    named = plan.split('id="pgjobs-plan-tasks">', 1)[1].split("</span>", 1)[0]
    assert named == "demo.charge (3), demo.flaky (1), and 2 more tasks"
