"""The admin: read-only views, redaction, permissioned and audited actions, the dashboard."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.templatetags.admin_list import result_headers
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_pgjobs import job
from django_pgjobs.admin import (
    EstimatedCountPaginator,
    duration_text,
    planner_rows,
    time_text,
)
from django_pgjobs.models import Attempt, Job, OperatorAction, QueueState
from django_pgjobs.outcomes import Outcome
from django_pgjobs.redaction import REDACTED
from django_pgjobs.status import AttemptOutcome, JobStatus, TerminalReason
from django_pgjobs.transitions import claim_jobs, pause_queue, settle
from tests.conftest import make_user
from tests.factories import AttemptFactory, JobFactory, ReceiptFactory

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/pgjobs/job/"
SECRET_CARD = "4111111111111111"
SECRET_EMAIL = "ada@example.com"


@job("tests.admin.charge", redact=("customer.email",))
def charge(ctx: Any, payload: Any) -> None:
    """A handler whose payload carries secrets."""


def secret_payload() -> dict[str, Any]:
    return {"order": 7, "card_number": SECRET_CARD, "customer": {"email": SECRET_EMAIL}}


def action_choices(client: Client) -> set[str]:
    response = client.get(CHANGELIST)
    assert response.status_code == 200
    form = response.context["action_form"]
    return {name for name, _ in form.fields["action"].choices if name}


def start_action(client: Client, action: str, jobs: list[Job]) -> Any:
    return client.post(CHANGELIST, {
        "action": action, "index": 0, "_selected_action": [j.pk for j in jobs],
    })


def confirm_action(client: Client, action: str, jobs: list[Job], **fields: Any) -> Any:
    return client.post(CHANGELIST, {
        "action": action, "_selected_action": jobs[0].pk, "pgjobs_confirm": "yes",
        "pgjobs_ids": ",".join(str(j.pk) for j in jobs), **fields,
    })


def status(j: Job) -> str:
    return Job.objects.get(pk=j.pk).status


# --- read-only ----------------------------------------------------------------------------------


def test_jobs_cannot_be_added_changed_or_deleted_even_by_a_superuser(login: Any) -> None:
    client = login(superuser=True)
    j = JobFactory()
    assert client.get(f"{CHANGELIST}add/").status_code == 403
    assert client.post(f"{CHANGELIST}{j.pk}/change/", {"status": "dead"}).status_code == 403
    assert client.post(f"{CHANGELIST}{j.pk}/delete/", {"post": "yes"}).status_code == 403
    assert "delete_selected" not in action_choices(client)
    assert status(j) == JobStatus.READY
    for model in ("attempt", "idempotencyreceipt", "operatoraction"):
        assert client.get(f"/admin/pgjobs/{model}/add/").status_code == 403


def test_a_superuser_sees_every_action(login: Any) -> None:
    assert action_choices(login(superuser=True)) == {
        "retry_selected", "run_now_selected", "replay_selected", "cancel_selected",
        "dead_letter_selected", "export_selected",
    }


def test_a_staff_user_with_only_view_permission_sees_no_operator_action(login: Any) -> None:
    assert action_choices(login("view_job")) == {"export_selected"}


def test_each_action_needs_its_own_permission(login: Any) -> None:
    assert action_choices(login("view_job", "cancel_job")) == {"cancel_selected",
                                                               "export_selected"}


@pytest.mark.parametrize("action", ["retry_selected", "replay_selected", "cancel_selected",
                                    "dead_letter_selected"])
def test_a_forged_action_post_is_refused_and_changes_nothing(login: Any, action: str) -> None:
    client = login("view_job")
    dead, ready = JobFactory(dead=True), JobFactory()
    assert start_action(client, action, [dead, ready]).status_code == 403
    forged = confirm_action(client, action, [dead, ready], reason="x", key_choice="none")
    assert forged.status_code == 403
    assert (status(dead), status(ready)) == (JobStatus.DEAD, JobStatus.READY)
    assert Job.objects.count() == 2
    assert OperatorAction.objects.count() == 0


def test_a_permission_for_one_action_does_not_open_another(login: Any) -> None:
    client = login("view_job", "retry_job")
    ready = JobFactory()
    assert confirm_action(client, "cancel_selected", [ready]).status_code == 403
    assert status(ready) == JobStatus.READY


def test_a_user_without_view_permission_cannot_see_jobs(login: Any) -> None:
    client = login()
    assert client.get(CHANGELIST).status_code == 403
    assert client.get(f"{CHANGELIST}dashboard/").status_code == 403


# --- retry --------------------------------------------------------------------------------------


def test_retry_confirmation_says_what_happens_to_how_many_jobs_in_which_states(
    login: Any,
) -> None:
    client = login("view_job", "retry_job")
    jobs = [JobFactory(dead=True), JobFactory(dead=True), JobFactory(cancelled=True),
            JobFactory(running=True), JobFactory(succeeded=True)]
    page = start_action(client, "retry_selected", jobs)
    assert page.status_code == 200
    plan = page.context["plan"]
    assert plan.changes == [
        "3 jobs (2 dead, 1 cancelled) will go back to ready now, with attempts reset to 0 and "
        "a fresh max age."
    ]
    assert plan.unchanged == [
        "2 jobs (1 running, 1 succeeded) are not dead or cancelled and will not change."
    ]
    assert "receipts are kept" in plan.notes[0]
    assert "You selected 5 jobs, of " in page.content.decode()
    # Showing the page changed nothing.
    assert [status(j) for j in jobs[:3]] == [JobStatus.DEAD, JobStatus.DEAD, JobStatus.CANCELLED]
    assert OperatorAction.objects.count() == 0


def test_retry_puts_dead_and_cancelled_jobs_back_to_ready_and_audits_it(login: Any) -> None:
    client = login("view_job", "retry_job", username="alice")
    dead, cancelled, running = JobFactory(dead=True), JobFactory(cancelled=True), JobFactory(
        running=True
    )
    response = confirm_action(client, "retry_selected", [dead, cancelled, running],
                              reason="bug fixed in 1.4.2")
    assert response.status_code == 302
    for j in (dead, cancelled):
        j.refresh_from_db()
        assert (j.status, j.attempts, j.finished_at, j.terminal_reason) == (
            JobStatus.READY, 0, None, "")
    assert status(running) == JobStatus.RUNNING
    audit = OperatorAction.objects.get()
    assert (audit.actor_name, audit.actor.username, audit.action, audit.reason) == (
        "alice", "alice", "retry", "bug fixed in 1.4.2")
    assert audit.job_ids == sorted([dead.pk, cancelled.pk, running.pk])
    assert (audit.selected, audit.changed) == (3, 2)
    assert audit.detail == {
        "before": {"dead": 1, "cancelled": 1, "running": 1},
        "retried": sorted([dead.pk, cancelled.pk]),
    }
    [message] = [str(m) for m in client.get(CHANGELIST).context["messages"]]
    said, selected = message.split(" Selected: ")
    assert said == "Retried 2 jobs: ready now with a fresh attempt budget."
    # The message links the jobs it names.
    assert f'<a href="{CHANGELIST}{dead.pk}/change/">job {dead.pk}</a>' in selected


# --- cancel -------------------------------------------------------------------------------------


def test_cancel_confirmation_separates_waiting_running_and_finished_jobs(login: Any) -> None:
    client = login("view_job", "cancel_job")
    jobs = [JobFactory(), JobFactory(scheduled=True), JobFactory(retrying=True),
            JobFactory(running=True), JobFactory(running=True, cancel_requested_at=timezone.now()),
            JobFactory(succeeded=True)]
    plan = start_action(client, "cancel_selected", jobs).context["plan"]
    assert plan.changes[0] == (
        "3 jobs (1 scheduled, 1 ready, 1 retrying) will be cancelled now and will not run."
    )
    # What will happen, as the lease contract has it: settled cancelled, not run to its end.
    assert plan.changes[1] == (
        "1 job (running) will be cancelled by their worker within about 0.5 s (a handler with "
        "heartbeats may hear of it sooner): a job whose handler has not started never starts; "
        "one that runs is settled cancelled and its handler stopped where it can be (an async "
        "task is cancelled, a child process is killed) or told (ctx.cancelled; ctx.heartbeat() "
        "raises Cancelled). What a handler reports after that is kept beside its attempt and "
        "changes nothing: the job ends cancelled. A job whose handler finishes before its "
        "worker settles the cancel ends as its handler reported; its page says the cancel came "
        "too late.")
    assert plan.unchanged == [
        "1 job (running) was already asked to stop.",
        "1 job (1 succeeded) is finished and will not change.",
    ]


def test_cancel_cancels_waiting_jobs_and_asks_running_ones_to_stop(login: Any) -> None:
    client = login("view_job", "cancel_job")
    ready, scheduled, running, done = (JobFactory(), JobFactory(scheduled=True),
                                       JobFactory(running=True), JobFactory(succeeded=True))
    assert confirm_action(client, "cancel_selected", [ready, scheduled, running, done],
                          reason="customer withdrew").status_code == 302
    assert (status(ready), status(scheduled), status(done)) == (
        JobStatus.CANCELLED, JobStatus.CANCELLED, JobStatus.SUCCEEDED)
    running.refresh_from_db()
    assert running.status == JobStatus.RUNNING and running.cancel_requested_at is not None
    audit = OperatorAction.objects.get()
    assert (audit.action, audit.changed, audit.reason) == ("cancel", 3, "customer withdrew")
    assert audit.detail == {
        "before": {"ready": 1, "scheduled": 1, "running": 1, "succeeded": 1},
        "cancelled": sorted([ready.pk, scheduled.pk]), "asked_to_stop": [running.pk],
        "too_late": {str(done.pk): "succeeded"},
    }


def test_a_cancelled_running_job_page_says_who_cancelled_it_when_and_why(login: Any) -> None:
    client = login("view_job", "cancel_job", username="alice")
    running = JobFactory()
    [claimed] = claim_jobs("w1", running.queue, 1)
    confirm_action(client, "cancel_selected", [running], reason="customer withdrew")
    assert settle([Outcome.cancelled(claimed, "cancelled by an operator while it ran")]) == {
        claimed.lease_token: True}
    # The handler's own late report, a LeaseLost it raised, changes nothing of the record.
    late = replace(Outcome.cancelled(claimed, "x"), attempt_outcome=AttemptOutcome.FAILED,
                   status=JobStatus.RETRYING, failure_class="transient",
                   error="Transient: lease lost; stopping")
    assert settle([late]) == {claimed.lease_token: False}
    audit = OperatorAction.objects.get()
    html = client.get(f"{CHANGELIST}{running.pk}/change/").content.decode()
    assert f"Cancelled by alice at {time_text(audit.created_at)}: customer withdrew" in html
    assert "transient" not in html and "lease lost" not in html
    attempt = Attempt.objects.get(job_id=running.pk)
    assert (attempt.outcome, attempt.failure_class, attempt.error) == (
        AttemptOutcome.CANCELLED, "", "cancelled by an operator while it ran")


def test_a_succeeded_job_page_shows_the_attempt_that_has_no_row(login: Any) -> None:
    client = login("view_job")
    job = JobFactory()
    [claimed] = claim_jobs("worker-7", job.queue, 1)
    assert settle([Outcome.succeeded(claimed, "null", 4321)]) == {claimed.lease_token: True}
    assert not Attempt.objects.exists()
    html = client.get(f"{CHANGELIST}{job.pk}/change/").content.decode()
    assert "worker-7" in html and "4321" in html


def test_a_cancel_that_came_after_the_job_succeeded_shows_it_came_too_late(login: Any) -> None:
    client = login("view_job", "cancel_job", username="alice")
    done, finishing = JobFactory(succeeded=True), JobFactory()
    [claimed] = claim_jobs("w1", finishing.queue, 1)
    confirm_action(client, "cancel_selected", [done, finishing], reason="oops")
    # The handler's success lands after the cancel committed, before its worker acted on it.
    assert settle([Outcome.succeeded(claimed, "null", 1)]) == {claimed.lease_token: True}
    assert status(finishing) == JobStatus.SUCCEEDED
    audit = OperatorAction.objects.get()
    for ended in (done, finishing):
        html = client.get(f"{CHANGELIST}{ended.pk}/change/").content.decode()
        assert (f"Cancel by alice at {time_text(audit.created_at)}: oops came too late: "
                "the job had already succeeded") in html


# --- dead-letter --------------------------------------------------------------------------------


def test_dead_letter_needs_a_reason_and_changes_nothing_without_one(login: Any) -> None:
    client = login("view_job", "deadletter_job")
    ready = JobFactory()
    page = confirm_action(client, "dead_letter_selected", [ready], reason="  ")
    assert page.status_code == 200  # the page again, with the error
    assert page.context["form"].errors == {"reason": ["This field is required."]}
    assert status(ready) == JobStatus.READY
    assert OperatorAction.objects.count() == 0


def test_dead_letter_moves_waiting_jobs_to_dead_with_the_reason(login: Any) -> None:
    client = login("view_job", "deadletter_job")
    ready, retrying, running = JobFactory(), JobFactory(retrying=True), JobFactory(running=True)
    plan = start_action(client, "dead_letter_selected", [ready, retrying, running]).context["plan"]
    assert plan.changes == [
        "2 jobs (1 ready, 1 retrying) will move to dead now with the reason below; an operator "
        "can retry them later."
    ]
    assert plan.unchanged[0].startswith("1 job (1 running) will not change")
    confirm_action(client, "dead_letter_selected", [ready, retrying, running],
                   reason="poison payload")
    for j in (ready, retrying):
        j.refresh_from_db()
        assert (j.status, j.terminal_reason, j.last_error) == (
            JobStatus.DEAD, TerminalReason.OPERATOR, "dead-lettered by operator: poison payload")
    assert status(running) == JobStatus.RUNNING
    audit = OperatorAction.objects.get()
    assert (audit.action, audit.changed, audit.detail["dead_lettered"]) == (
        "dead_letter", 2, sorted([ready.pk, retrying.pk]))


# --- replay -------------------------------------------------------------------------------------


def test_replay_confirmation_lists_the_receipts_that_will_and_will_not_protect_it(
    login: Any,
) -> None:
    client = login("view_job", "replay_job")
    done, ready = JobFactory(succeeded=True), JobFactory()
    ReceiptFactory(job=done, scope="charge", key="order:7")
    ReceiptFactory(job=done, scope="email", key="welcome:7",
                   expires_at=timezone.now() - timedelta(hours=1))
    plan = start_action(client, "replay_selected", [done, ready]).context["plan"]
    assert plan.changes[0].startswith(
        "1 job (1 succeeded) will be enqueued again as a new job with the same payload")
    assert plan.unchanged == [
        "1 job (1 ready) is not finished and will not be replayed: retry or cancel instead."
    ]
    verdicts = dict(plan.receipts)
    assert verdicts[f"charge:order:7 (job {done.pk})"].startswith("protects it until ")
    assert verdicts[f"email:welcome:7 (job {done.pk})"].startswith(
        "will not protect it: expired at ")
    assert "does not choose them" in plan.notes[0]


def test_replay_keeping_the_key_moves_it_to_the_new_job(login: Any) -> None:
    client = login("view_job", "replay_job", username="bob")
    original = JobFactory(dead=True, task="demo.noop", idempotency_key="order-7",
                          payload={"n": 7}, trace_id="t-7")
    response = confirm_action(client, "replay_selected", [original], key_choice="keep",
                              reason="provider fixed")
    assert response.status_code == 302
    replay = Job.objects.exclude(pk=original.pk).get()
    original.refresh_from_db()
    assert (replay.status, replay.payload, replay.idempotency_key, replay.trace_id) == (
        JobStatus.READY, {"n": 7}, "order-7", "t-7")
    assert (original.status, original.idempotency_key) == (JobStatus.DEAD, None)
    audit = OperatorAction.objects.get()
    assert (audit.action, audit.actor_name, audit.job_ids, audit.changed) == (
        "replay", "bob", [original.pk, replay.pk], 1)
    assert audit.detail == {"replay_id": replay.pk, "original_id": original.pk,
                            "original_key": "order-7", "replay_key": "order-7",
                            "key_moved": True}
    # Each job's page links the other.
    page = client.get(f"{CHANGELIST}{original.pk}/change/").content.decode()
    assert f'replayed as <a href="{CHANGELIST}{replay.pk}/change/"' in page
    page = client.get(f"{CHANGELIST}{replay.pk}/change/").content.decode()
    assert f'a replay of <a href="{CHANGELIST}{original.pk}/change/"' in page


def test_replay_with_a_new_key_or_none_leaves_the_original_its_key(login: Any) -> None:
    client = login("view_job", "replay_job")
    first = JobFactory(succeeded=True, idempotency_key="k-1")
    second = JobFactory(cancelled=True, idempotency_key="k-2")
    confirm_action(client, "replay_selected", [first], key_choice="new", new_key="k-1-again")
    confirm_action(client, "replay_selected", [second], key_choice="none")
    keys = dict(Job.objects.exclude(pk__in=[first.pk, second.pk])
                .values_list("payload__n", "idempotency_key"))
    assert keys == {first.payload["n"]: "k-1-again", second.payload["n"]: None}
    assert Job.objects.get(pk=first.pk).idempotency_key == "k-1"
    assert Job.objects.get(pk=second.pk).idempotency_key == "k-2"


def test_a_new_key_is_for_one_replay_at_a_time(login: Any) -> None:
    client = login("view_job", "replay_job")
    jobs = [JobFactory(dead=True), JobFactory(dead=True)]
    page = confirm_action(client, "replay_selected", jobs, key_choice="new", new_key="k")
    assert page.context["form"].non_field_errors() == [
        "A new key can be given to one replay at a time."]
    assert Job.objects.count() == 2


def test_a_replay_whose_key_is_taken_creates_nothing(login: Any) -> None:
    client = login("view_job", "replay_job")
    original = JobFactory(dead=True, idempotency_key="k-1")
    JobFactory(idempotency_key="taken")
    confirm_action(client, "replay_selected", [original], key_choice="new", new_key="taken")
    assert Job.objects.count() == 2
    assert OperatorAction.objects.count() == 0
    messages = [str(m).split(" Selected: ")[0] for m in client.get(CHANGELIST).context["messages"]]
    assert len(messages) == 1 and "already used by job" in messages[0]


# --- redaction ----------------------------------------------------------------------------------


def test_the_list_shows_payloads_redacted(login: Any) -> None:
    client = login("view_job")
    JobFactory(task="tests.admin.charge", payload=secret_payload())
    html = client.get(CHANGELIST).content.decode()
    assert SECRET_CARD not in html and SECRET_EMAIL not in html
    assert f"&quot;card_number&quot;: &quot;{REDACTED}&quot;" in html


def test_the_detail_redacts_payload_result_error_and_each_attempt(login: Any) -> None:
    client = login("view_job")
    j = JobFactory(task="tests.admin.charge", payload=secret_payload(), dead=True,
                   result={"token": "tok_live_1"},
                   last_error=f"CardError: card {SECRET_CARD} declined for {SECRET_EMAIL}")
    AttemptFactory(job=j, number=1, outcome="failed", failure_class="transient",
                   error=f"Timeout talking to bank for {SECRET_CARD}",
                   traceback=f'File "bank.py", line 3\nTimeout: authorization=Bearer abc123 '
                             f"card {SECRET_CARD}", duration_ms=1234, worker_id="w-1")
    html = client.get(f"{CHANGELIST}{j.pk}/change/").content.decode()
    for secret in (SECRET_CARD, SECRET_EMAIL, "tok_live_1", "abc123"):
        assert secret not in html
    assert f"CardError: card {REDACTED} declined for {REDACTED}" in html
    assert f"Timeout talking to bank for {REDACTED}" in html
    assert "1234 ms" in html and "w-1" in html
    assert "Show raw payload" not in html


def test_the_raw_payload_needs_its_permission_and_each_look_is_audited(login: Any) -> None:
    j = JobFactory(task="tests.admin.charge", payload=secret_payload())
    raw_url = f"{CHANGELIST}{j.pk}/raw-payload/"
    viewer = login("view_job", username="viewer")
    for refused in (viewer.get(raw_url), viewer.post(raw_url)):
        assert refused.status_code == 403
        html = refused.content.decode()
        # The admin's own page, naming the permission that is missing.
        assert 'id="site-name"' in html and '<div class="breadcrumbs">' in html
        assert ("Showing a job&#x27;s raw payload needs the permission\n“Can see unredacted "
                "payloads” (<code>pgjobs.view_raw_payload</code>)") in html
        assert SECRET_CARD not in html
    assert OperatorAction.objects.count() == 0

    auditor = login("view_job", "view_raw_payload", username="auditor")
    assert "Show raw payload" in auditor.get(f"{CHANGELIST}{j.pk}/change/").content.decode()
    # Following the link only asks: nothing is shown and nothing is audited until the POST.
    asking = auditor.get(raw_url)
    assert asking.status_code == 200
    assert SECRET_CARD not in asking.content.decode()
    assert 'id="pgjobs-reveal-form"' in asking.content.decode()
    assert auditor.head(raw_url).status_code == 200
    assert OperatorAction.objects.count() == 0
    page = auditor.post(raw_url)
    assert page.status_code == 200 and SECRET_CARD in page.content.decode()
    audit = OperatorAction.objects.get()
    assert (audit.action, audit.actor_name, audit.job_ids, audit.changed) == (
        "view_raw_payload", "auditor", [j.pk], 0)


def test_revealing_the_raw_payload_needs_the_csrf_token(login: Any) -> None:
    j = JobFactory(task="tests.admin.charge", payload=secret_payload())
    raw_url = f"{CHANGELIST}{j.pk}/raw-payload/"
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(make_user("auditor", "view_job", "view_raw_payload"))
    # A cross-site form posting to the page carries no token: refused, nothing audited.
    refused = strict.post(raw_url)
    assert refused.status_code == 403 and SECRET_CARD not in refused.content.decode()
    token = strict.get(raw_url).context["csrf_token"]
    assert SECRET_CARD in strict.post(raw_url, {"csrfmiddlewaretoken": str(token)}).content.decode()
    assert OperatorAction.objects.filter(action="view_raw_payload").count() == 1


def test_export_is_redacted_like_the_list(login: Any) -> None:
    client = login("view_job")
    j = JobFactory(task="tests.admin.charge", payload=secret_payload(),
                   last_error=f"declined {SECRET_CARD}")
    response = start_action(client, "export_selected", [j])
    assert response["Content-Disposition"] == 'attachment; filename="pgjobs-jobs.json"'
    exported = json.loads(response.content)["jobs"]
    assert [(e["id"], e["payload"], e["last_error"]) for e in exported] == [
        (j.pk, {"order": 7, "card_number": REDACTED, "customer": {"email": REDACTED}},
         f"declined {REDACTED}")
    ]


def echoing_result() -> dict[str, Any]:
    """A handler's result that repeats its payload's hidden values under keys of its own."""
    return {"receipt_for": SECRET_EMAIL, "summary": f"charged {SECRET_CARD} for {SECRET_EMAIL}"}


SCRUBBED_ECHO = {"receipt_for": REDACTED, "summary": f"charged {REDACTED} for {REDACTED}"}


def test_a_result_that_echoes_the_payload_s_secrets_shows_them_scrubbed(login: Any) -> None:
    client = login("view_job", "view_idempotencyreceipt")
    j = JobFactory(task="tests.admin.charge", payload=secret_payload(), result=echoing_result())
    receipt = ReceiptFactory(job=j, result=echoing_result())
    pages = [client.get(f"{CHANGELIST}{j.pk}/change/"),
             client.get(f"/admin/pgjobs/idempotencyreceipt/{receipt.pk}/change/")]
    for html in (page.content.decode() for page in pages):
        assert SECRET_CARD not in html and SECRET_EMAIL not in html
        assert f"&quot;summary&quot;: &quot;charged {REDACTED} for {REDACTED}&quot;" in html
    exported = json.loads(start_action(client, "export_selected", [j]).content)["jobs"]
    assert [e["result"] for e in exported] == [SCRUBBED_ECHO]


def test_a_superuser_sees_the_echoed_secrets_of_a_result_only_on_the_raw_page(
    login: Any,
) -> None:
    client = login(superuser=True)
    j = JobFactory(task="tests.admin.charge", payload=secret_payload(), result=echoing_result())
    assert SECRET_EMAIL not in client.get(f"{CHANGELIST}{j.pk}/change/").content.decode()
    exported = json.loads(start_action(client, "export_selected", [j]).content)["jobs"]
    assert [e["result"] for e in exported] == [SCRUBBED_ECHO]
    raw = client.post(f"{CHANGELIST}{j.pk}/raw-payload/").content.decode()
    assert f"&quot;summary&quot;: &quot;charged {SECRET_CARD} for {SECRET_EMAIL}&quot;" in raw


def test_attempt_receipt_and_audit_pages_are_redacted_and_read_only(login: Any) -> None:
    client = login("view_job", "view_attempt", "view_idempotencyreceipt", "view_operatoraction")
    j = JobFactory(task="tests.admin.charge", payload=secret_payload(), dead=True)
    attempt = AttemptFactory(job=j, error=f"declined {SECRET_CARD}", outcome="dead")
    receipt = ReceiptFactory(job=j, result={"charge": "ch_1", "api_key": "sk_live_9"})
    from django_pgjobs.transitions import Actor, retry_jobs

    retry_jobs([j.pk], actor=Actor("carol"), reason="retry after fix")
    audit = OperatorAction.objects.get()

    html = client.get(f"/admin/pgjobs/attempt/{attempt.pk}/change/").content.decode()
    assert f"declined {REDACTED}" in html and SECRET_CARD not in html
    html = client.get(f"/admin/pgjobs/idempotencyreceipt/{receipt.pk}/change/").content.decode()
    assert "ch_1" in html and "sk_live_9" not in html
    html = client.get(f"/admin/pgjobs/operatoraction/{audit.pk}/change/").content.decode()
    assert "carol" in html and "retry after fix" in html and "&quot;retried&quot;" in html
    found = client.get("/admin/pgjobs/idempotencyreceipt/", {"q": f"{receipt.scope}:{receipt.key}"})
    assert [r.pk for r in found.context["cl"].result_list] == [receipt.pk]
    job_page = client.get(f"{CHANGELIST}{j.pk}/change/").content.decode()
    assert "retry by carol retry after fix" in job_page


# --- list: columns, search, filters, queries ----------------------------------------------------


def test_search_finds_ids_and_keys_whole_and_trace_ids_and_tasks_by_their_start(
    login: Any,
) -> None:
    client = login("view_job")
    by_id, by_key, by_trace = (JobFactory(task="demo.noop"),
                               JobFactory(task="tests.ok", idempotency_key="ik-1"),
                               JobFactory(task="demo.noop", trace_id="trace-abcd"))
    longer = JobFactory(task="demo.noop", idempotency_key="ik-10", trace_id="trace-abce")
    JobFactory(task="tests.ok", trace_id="other-trace")

    def found(term: str) -> set[int]:
        return {j.pk for j in client.get(CHANGELIST, {"q": term}).context["cl"].result_list}

    assert found(str(by_id.pk)) == {by_id.pk}
    assert found("ik-1") == {by_key.pk}  # a key is whole: not ik-10
    assert found("trace-abcd") == {by_trace.pk}
    assert found("trace-abc") == {by_trace.pk, longer.pk}
    assert found("tests.") == {by_key.pk, longer.pk + 1}  # every task whose name starts so
    assert found("race-abc") == set()  # the start, not anywhere
    assert found("nothing-like-it") == set()


def test_filters_offer_known_queues_and_tasks_without_reading_the_table(login: Any) -> None:
    client = login("view_job")
    JobFactory(queue="mail")
    JobFactory(queue="mail", task="tests.ok")
    JobFactory(queue="reports", succeeded=True)
    with override_settings(PGJOBS_QUEUES=["default", "mail", "reports"]):
        response = client.get(CHANGELIST, {"queue": "mail", "task": "tests.ok"})
    cl = response.context["cl"]
    assert [j.task for j in cl.result_list] == ["tests.ok"]
    specs = {spec.title: spec for spec in cl.filter_specs}
    queue_choices = [c["display"] for c in specs["queue"].choices(cl)]
    assert queue_choices == ["All", "default", "mail", "reports"]
    task_choices = [c["display"] for c in specs["task"].choices(cl)]
    assert "tests.admin.charge" in task_choices and "demo.noop" in task_choices


def test_list_columns_show_attempts_age_and_a_running_jobs_lease_with_its_status(
    login: Any,
) -> None:
    client = login("view_job")
    JobFactory(running=True, attempts=2, max_attempts=5,
               created_at=timezone.now() - timedelta(minutes=3, seconds=5),
               lease_expires_at=timezone.now() + timedelta(seconds=20, milliseconds=500))
    JobFactory(running=True, lease_expires_at=timezone.now() - timedelta(seconds=90))
    html = client.get(CHANGELIST).content.decode()
    assert '<td class="field-attempts_used">2/5</td>' in html
    assert '<td class="field-age">3m 5s</td>' in html or '<td class="field-age">3m 6s</td>' in html
    running = '<span class="pgjobs-status pgjobs-status-live">running</span>'
    assert f'<td class="field-status_shown">{running} <small>lease 20s</small></td>' in html
    assert (f'<td class="field-status_shown">{running} <small>lease expired 1m 30s ago</small>'
            '</td>') in html


def test_duration_text() -> None:
    assert [duration_text(s) for s in (0, 59, 61, 3600, 3 * 86400 + 7200, -5)] == [
        "0s", "59s", "1m 1s", "1h 0m", "3d 2h", "0s"]


def test_the_list_and_detail_do_not_query_per_row(login: Any) -> None:
    client = login("view_job", "view_attempt")

    def queries(url: str) -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert client.get(url).status_code == 200
        return len(ctx.captured_queries)

    JobFactory.create_batch(3, task="tests.admin.charge", payload=secret_payload())
    few = queries(CHANGELIST)
    JobFactory.create_batch(30, task="tests.admin.charge", payload=secret_payload())
    assert queries(CHANGELIST) == few

    j = JobFactory(dead=True)
    AttemptFactory(job=j, number=1)
    one = queries(f"{CHANGELIST}{j.pk}/change/")
    for n in range(2, 12):
        AttemptFactory(job=j, number=n)
    assert queries(f"{CHANGELIST}{j.pk}/change/") == one
    attempts = queries("/admin/pgjobs/attempt/")
    AttemptFactory.create_batch(10)
    assert queries("/admin/pgjobs/attempt/") == attempts


def test_counts_above_the_limit_come_from_the_planner(monkeypatch: Any) -> None:
    JobFactory.create_batch(3)
    queryset = Job.objects.filter(status=JobStatus.READY).order_by("id")
    assert EstimatedCountPaginator(queryset, 10).count == 3
    monkeypatch.setattr("django_pgjobs.admin.display.EXACT_COUNT_MAX_ROWS", -1)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE pgjobs_job")
    assert EstimatedCountPaginator(queryset, 10).count == planner_rows(queryset)


def test_searches_use_indexes_on_a_large_history() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO pgjobs_job (task, payload_version, queue, payload, status, priority,
                base_priority, run_at, attempts, max_attempts, snoozes, lease_seconds,
                idempotency_key, trace_id, failure_class, terminal_reason, last_error,
                created_at, finished_at, updated_at)
            SELECT 'task.' || (g % 12), 1, 'default', '{}'::jsonb, 'succeeded', 0, 0, now(),
                   1, 5, 0, 30, CASE WHEN g % 2 = 0 THEN 'key-' || g END, md5(g::text), '',
                   'succeeded', '', now(), now(), now()
            FROM generate_series(1, 60000) AS g
            """
        )
        cursor.execute("ANALYZE pgjobs_job")
        client = Client()
        client.force_login(make_user("root", superuser=True))
        with CaptureQueriesContext(connection) as ctx:
            response = client.get(CHANGELIST, {"q": "key-300"})
        assert len(response.context["cl"].result_list) == 1
        search_sql = [q["sql"] for q in ctx.captured_queries if "pgjobs_job" in q["sql"]]
        plans = []
        for text in search_sql:
            if text.lstrip().startswith(("SELECT", "WITH", "--")) and "EXPLAIN" not in text:
                cursor.execute("EXPLAIN " + text)
                plans.append("\n".join(row[0] for row in cursor.fetchall()))
    joined = "\n".join(plans)
    assert "Seq Scan on pgjobs_job" not in joined
    assert "pgjobs_job_idempotency_key" in joined and "pgjobs_job_trace_prefix_idx" in joined


# --- dashboard ----------------------------------------------------------------------------------


@override_settings(PGJOBS_BACKLOG_MAX_AGE_SECONDS={"mail": 60})
def test_the_dashboard_renders_the_queues_against_their_backlog_policy(login: Any) -> None:
    client = login("view_job")
    JobFactory.create_batch(2, queue="mail", run_at=timezone.now() - timedelta(minutes=5))
    JobFactory(queue="mail", scheduled=True)
    JobFactory(queue="mail", running=True, lease_expires_at=timezone.now() - timedelta(seconds=5))
    JobFactory(queue="mail", dead=True)
    JobFactory(queue="reports", retrying=True)
    changelist = client.get(CHANGELIST).content.decode()
    assert 'href="/admin/pgjobs/job/dashboard/"' in changelist

    response = client.get(reverse("admin:pgjobs_job_dashboard"))
    assert response.status_code == 200
    rows = {r.queue: r for r in response.context["queue_rows"]}
    assert [c.count for c in rows["mail"].cells] == [2, 0, 1, 1, 0, 0, 1]
    assert [c.count for c in rows["reports"].cells] == [0, 0, 0, 0, 1, 0, 0]
    assert (rows["mail"].policy, rows["mail"].healthy) == ("1m 0s", False)
    assert rows["reports"].policy == "none" and rows["reports"].healthy
    assert rows["mail"].cells[0].url == f"{CHANGELIST}?queue=mail&status__exact=ready"
    html = response.content.decode()
    assert 'id="pgjobs-history-all"' in html and 'id="pgjobs-wait-all"' in html
    assert "too old" in html
    assert response.context["snapshot"].leases.expired == 1


# --- operator transitions called from code ------------------------------------------------------


def test_a_transition_called_from_code_is_audited_without_a_user() -> None:
    from django_pgjobs.transitions import Actor, cancel_jobs, dead_letter_jobs

    ready = JobFactory()
    assert cancel_jobs([ready.pk, ready.pk]) == (1, 0)
    with pytest.raises(ValueError, match="needs a reason"):
        dead_letter_jobs([JobFactory().pk], " ", actor=Actor("script"))
    audit = OperatorAction.objects.get()
    assert (audit.actor, audit.actor_name, audit.job_ids, audit.selected) == (
        None, "", [ready.pk], 1)


def test_replay_refuses_a_job_that_is_not_finished() -> None:
    from django_pgjobs.enqueuing import KEEP_KEY, replay_job

    running = JobFactory(running=True, idempotency_key="k")
    with pytest.raises(ValueError, match="is not finished"):
        replay_job(running, idempotency_key=KEEP_KEY)
    assert Job.objects.count() == 1 and OperatorAction.objects.count() == 0
    assert Job.objects.get().idempotency_key == "k"


def test_keeping_the_key_of_an_unkeyed_job_replays_it_without_one() -> None:
    from django_pgjobs.enqueuing import KEEP_KEY, replay_job

    original = JobFactory(dead=True)
    replay = replay_job(original, idempotency_key=KEEP_KEY)
    assert (replay.idempotency_key, replay.status, replay.pk != original.pk) == (
        None, JobStatus.READY, True)
    assert OperatorAction.objects.get().detail["key_moved"] is False


@pytest.mark.django_db(transaction=True)
def test_retried_jobs_wake_listening_workers_when_the_action_commits(
    other_connection: Any,
) -> None:
    from django_pgjobs.transitions import retry_jobs

    dead = JobFactory(dead=True, queue="mail")
    JobFactory(dead=True, queue="mail")
    other_connection.cursor().execute("LISTEN pgjobs")
    assert retry_jobs(list(Job.objects.values_list("id", flat=True))) == 2
    notes = list(other_connection.connection.notifies(timeout=5, stop_after=1))
    assert [(n.channel, n.payload) for n in notes] == [("pgjobs", "mail")]
    assert status(dead) == JobStatus.READY


# --- the query string ---------------------------------------------------------------------------


def secrets_everywhere() -> dict[str, Any]:
    """A job, an attempt, a receipt and an audit row, each holding the password 'Pa55word!'."""
    j = JobFactory(task="tests.admin.charge", payload={"order": 1, "password": "Pa55word!"},
                   dead=True, last_error="login failed for Pa55word!")
    attempt = AttemptFactory(job=j, error="bad password Pa55word!",
                             traceback="Traceback: password Pa55word!")
    receipt = ReceiptFactory(result={"password": "Pa55word!"}, job=j)
    OperatorAction.objects.create(actor_name="x", action="retry", job_ids=[j.pk],
                                  detail={"note": "Pa55word!"})
    return {"job": j, "attempt": attempt, "receipt": receipt}


ORACLES = [
    ("job", "payload__password__startswith", "Pa5", "Zz"),
    ("job", "payload__password", '"Pa55word!"', '"nope"'),
    ("job", "payload__icontains", "pa55", "zz"),
    ("job", "last_error__contains", "Pa55", "Zz"),
    ("job", "idempotency_key__startswith", "a", "z"),
    ("attempt", "error__contains", "Pa55", "Zz"),
    ("attempt", "traceback__contains", "Pa55", "Zz"),
    ("attempt", "job__payload__password__startswith", "P", "Z"),
    ("idempotencyreceipt", "result__password__startswith", "Pa5", "Zz"),
    ("operatoraction", "detail__note__startswith", "Pa5", "Zz"),
]


@pytest.mark.parametrize(("model", "lookup", "right", "wrong"), ORACLES)
def test_a_viewer_cannot_read_redacted_values_through_query_string_lookups(
    login: Any, model: str, lookup: str, right: str, wrong: str
) -> None:
    secrets_everywhere()
    client = login("view_job", "view_attempt", "view_idempotencyreceipt", "view_operatoraction")
    url = f"/admin/pgjobs/{model}/"
    # Refused the way Django refuses a disallowed lookup, whether the guess is right or wrong:
    # the answer says nothing about the value.
    answers = [client.get(url, {lookup: guess}) for guess in (right, wrong)]
    assert [a.status_code for a in answers] == [400, 400]
    assert answers[0].content == answers[1].content
    assert b"Pa55word!" not in answers[0].content


@pytest.mark.parametrize(("model", "params"), [
    ("job", {"status__exact": "dead"}), ("job", {"failure_class__exact": ""}),
    ("job", {"queue": "default"}), ("job", {"task": "tests.admin.charge"}),
    ("job", {"status__exact": "dead", "q": "1", "o": "1", "p": "1"}),
    ("attempt", {"outcome__exact": "running"}), ("attempt", {"failure_class__exact": ""}),
    ("operatoraction", {"action__exact": "retry"}),
])
def test_the_lists_own_filters_still_work(login: Any, model: str, params: dict[str, str]) -> None:
    secrets_everywhere()
    client = login("view_job", "view_attempt", "view_operatoraction")
    response = client.get(f"/admin/pgjobs/{model}/", params)
    assert response.status_code == 200
    assert response.context["cl"].result_count >= 0


def test_the_job_filters_select_the_right_rows(login: Any) -> None:
    made = secrets_everywhere()
    JobFactory(status=JobStatus.READY)
    client = login("view_job")
    dead = client.get(CHANGELIST, {"status__exact": "dead"}).context["cl"].result_list
    assert [j.pk for j in dead] == [made["job"].pk]


@pytest.mark.parametrize(("url", "expected", "rows"), [
    ("/admin/pgjobs/attempt/?q=x", 200, 0),
    ("/admin/pgjobs/attempt/?q=%C2%B2", 200, 0),
    ("/admin/pgjobs/idempotencyreceipt/?q=abc", 200, 0),
    (f"{CHANGELIST}?q=%C2%B2", 200, 0),
    (f"{CHANGELIST}?q=99999999999999999999999999", 200, 0),
    # Django's search form refuses a NUL and shows the unfiltered list.
    ("/admin/pgjobs/idempotencyreceipt/?q=a%00b:c", 200, 1),
    (f"{CHANGELIST}?q=%00", 200, 1),
    (f"{CHANGELIST}?id=9999999999999999999999999", 400, None),
    ("/admin/pgjobs/attempt/?id=9999999999999999999999999", 400, None),
    ("/admin/pgjobs/idempotencyreceipt/?id=9999999999999999999999999", 400, None),
    ("/admin/pgjobs/operatoraction/?id=9999999999999999999999999", 400, None),
    # A NUL in any list filter's value is refused before it reaches PostgreSQL.
    (f"{CHANGELIST}?status__exact=%00", 400, None),
    (f"{CHANGELIST}?failure_class__exact=a%00", 400, None),
    ("/admin/pgjobs/attempt/?failure_class__exact=%00", 400, None),
    ("/admin/pgjobs/attempt/?outcome__exact=%00", 400, None),
    ("/admin/pgjobs/operatoraction/?action__exact=%00", 400, None),
    ("/admin/pgjobs/schedule/?source__exact=%00", 400, None),
    ("/admin/pgjobs/schedule/?misfire__exact=%00", 400, None),
])
def test_odd_query_strings_answer_empty_or_400_never_500(
    login: Any, url: str, expected: int, rows: int | None
) -> None:
    secrets_everywhere()
    client = login("view_job", "view_attempt", "view_idempotencyreceipt", "view_operatoraction",
                   "view_schedule")
    response = client.get(url)
    assert response.status_code == expected
    if rows is not None:
        assert response.context["cl"].result_count == rows


def test_a_confirming_post_for_jobs_that_do_not_exist_writes_no_audit_row(login: Any) -> None:
    client = login(superuser=True)
    j = JobFactory(dead=True)
    response = client.post(CHANGELIST, {
        "action": "retry_selected", "_selected_action": j.pk, "pgjobs_confirm": "yes",
        "pgjobs_ids": "987654321,987654322",
    }, follow=True)
    assert response.status_code == 200
    assert "No job selected" in response.content.decode()
    assert OperatorAction.objects.count() == 0
    # The jobs that exist are kept, the rest dropped from the audit row.
    confirm_action(client, "retry_selected", [j], reason="")
    client.post(CHANGELIST, {
        "action": "retry_selected", "_selected_action": j.pk, "pgjobs_confirm": "yes",
        "pgjobs_ids": f"{j.pk},987654321",
    })
    audits = list(OperatorAction.objects.order_by("id").values_list("job_ids", flat=True))
    assert audits == [[j.pk], [j.pk]]


def filter_choices(response: Any, title: str) -> list[str]:
    """The choices the list's filter ``title`` offers, as shown."""
    cl = response.context["cl"]
    [spec] = [s for s in cl.filter_specs if s.title == title]
    return [str(choice["display"]) for choice in spec.choices(cl)]


def test_the_attempt_list_offers_no_outcome_that_no_row_can_have(login: Any) -> None:
    client = login("view_attempt")
    offered = filter_choices(client.get("/admin/pgjobs/attempt/"), "outcome")
    assert offered == ["All", "succeeded", "failed", "dead", "snoozed", "released",
                       "lease expired", "timed out", "cancelled", "lost"]


def test_the_queue_filter_offers_paused_queues_and_queues_without_ready_jobs(login: Any) -> None:
    JobFactory(queue="mail", status=JobStatus.READY)
    JobFactory(queue="reports", status=JobStatus.READY)
    JobFactory(queue="exports", running=True)
    pause_queue("reports")
    pause_queue("idle")  # paused with no job at all
    client = login("view_job")
    offered = filter_choices(client.get(CHANGELIST), "queue")
    assert {"mail", "reports", "exports", "idle"} <= set(offered)
    response = client.get(CHANGELIST, {"queue": "reports"})
    assert [j.queue for j in response.context["cl"].result_list] == ["reports"]


@pytest.fixture
def big_history() -> None:
    """Enough finished history and audit rows that reading it whole is a plan the planner weighs."""
    from tests.history import build_history

    with connection.cursor() as cursor:
        build_history(cursor, finished=60_000, ready=2000, queues=4, scheduled=100, retrying=50,
                      due=10, running=20, receipts=100)
        cursor.execute(
            "INSERT INTO pgjobs_operator_action (created_at, actor_name, action, reason, job_ids,"
            " schedule_ids, selected, changed, detail)"
            " SELECT now(), 'op', 'retry', '', jsonb_build_array(g, g + 1), '[]', 2, 2, '{}'"
            " FROM generate_series(1, 60000) AS g")
        cursor.execute("ANALYZE pgjobs_operator_action")


def plan_of(queryset: Any) -> str:
    return queryset.explain(format="json")


def seq_scanned(plan: str) -> set[str]:
    """The tables a JSON plan reads whole."""
    def nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
        return [node, *(n for child in node.get("Plans", []) for n in nodes(child))]
    return {n["Relation Name"] for n in nodes(json.loads(plan)[0]["Plan"])
            if n["Node Type"] == "Seq Scan"}


@pytest.mark.slow
def test_the_job_list_sorts_on_its_index_whatever_the_query_string_asks(
    login: Any, big_history: None
) -> None:
    client = login("view_job")
    response = client.get(CHANGELIST, {"o": "-7.5", "p": "3"})
    assert response.status_code == 200
    cl = response.context["cl"]
    assert list(cl.result_list.query.order_by) == ["-id"]
    plan = plan_of(cl.result_list)
    assert '"Sort"' not in plan and seq_scanned(plan) == set(), plan
    assert "pgjobs_job_pkey" in plan
    # Only the id column offers to sort.
    assert [h["text"] for h in result_headers(cl) if h["sortable"]] == ["id"]


@pytest.mark.slow
def test_the_job_list_stops_at_its_deepest_page(login: Any, big_history: None) -> None:
    client = login("view_job")
    first = client.get(CHANGELIST)
    assert first.context["cl"].result_count > 201 * 50  # the history goes deeper than that
    assert first.context["cl"].paginator.num_pages == 200
    assert client.get(CHANGELIST, {"p": "200"}).status_code == 200
    for page in ("201", "3999"):
        deep = client.get(CHANGELIST, {"status__exact": "succeeded", "p": page}, follow=True)
        assert deep.redirect_chain == [(f"{CHANGELIST}?status__exact=succeeded&p=200", 302)]
        assert deep.context["cl"].page_num == 200
        assert [str(m).split(" Selected: ")[0] for m in deep.context["messages"]] == [
            "The list stops at page 200: filter or search to reach older rows."]


@pytest.mark.slow
def test_the_queue_filter_reads_indexes_not_the_history(big_history: None) -> None:
    from django_pgjobs import sql

    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql.query("filter_queues"))
        plan = json.dumps(cursor.fetchone()[0])
    assert "pgjobs_job_claim_idx" in plan and "pgjobs_job_lease_idx" in plan, plan
    # The queue-state table, one row per queue ever paused, may be read whole.
    assert seq_scanned(plan) <= {"pgjobs_queue"}, plan


@pytest.mark.slow
def test_the_operator_history_of_a_job_reads_the_audit_index(big_history: None) -> None:
    from django_pgjobs.admin.jobs import operator_actions_of

    plan = plan_of(operator_actions_of(30_000))
    assert "pgjobs_action_job_ids_idx" in plan and seq_scanned(plan) == set(), plan
    assert [a.job_ids for a in operator_actions_of(30_000)] == [[30_000, 30_001], [29_999, 30_000]]


@pytest.mark.parametrize(("codenames", "offered"), [
    (("view_job", "view_queuestate"), False),
    (("view_job", "view_queuestate", "pause_queue"), True),
])
def test_the_dashboard_offers_pause_and_resume_only_to_who_may(
    login: Any, codenames: tuple[str, ...], offered: bool
) -> None:
    JobFactory(queue="mail")
    pause_queue("reports")
    client = login(*codenames)
    html = client.get(reverse("admin:pgjobs_job_dashboard")).content.decode()
    assert ('href="/admin/pgjobs/queuestate/">pause, resume</a>' in html) is offered
    states = {r.queue: r.paused for r in client.get(
        reverse("admin:pgjobs_job_dashboard")).context["queue_rows"]}
    assert states == {"mail": False, "reports": True}
    assert '<td class="pgjobs-queue-state">active</td>' in html


def test_every_page_shows_times_to_the_millisecond_with_the_zone(login: Any) -> None:
    from datetime import UTC, datetime

    at = datetime(2026, 3, 2, 7, 4, 5, 123456, tzinfo=UTC)
    j = JobFactory(running=True, claimed_at=at, heartbeat_at=at + timedelta(seconds=1),
                   lease_expires_at=at + timedelta(seconds=2))
    AttemptFactory(job=j, number=1, claimed_at=at - timedelta(seconds=7),
                   finished_at=at - timedelta(seconds=6, microseconds=500_000))
    OperatorAction.objects.create(actor_name="op", action="retry", job_ids=[j.pk])
    OperatorAction.objects.filter(job_ids=[j.pk]).update(created_at=at + timedelta(minutes=1))
    client = login(superuser=True)
    page = client.get(f"{CHANGELIST}{j.pk}/change/").content.decode()
    for shown in ("2026-03-02 07:04:05.123 UTC", "2026-03-02 07:04:06.123 UTC",
                  "2026-03-02 07:04:07.123 UTC",  # claim, heartbeat, lease expiry
                  "2026-03-02 07:03:58.123 UTC", "2026-03-02 07:03:58.623 UTC",  # the inline
                  "2026-03-02 07:05:05.123 UTC"):  # the operator history
        assert shown in page, shown
    assert "7:04 a.m." not in page
    with timezone.override("Europe/Paris"):
        assert "2026-03-02 08:04:05.123 CET" in client.get(
            f"{CHANGELIST}{j.pk}/change/").content.decode()
    attempts = client.get("/admin/pgjobs/attempt/").content.decode()
    assert "2026-03-02 07:03:58.123 UTC" in attempts
    audit = client.get("/admin/pgjobs/operatoraction/").content.decode()
    assert "2026-03-02 07:05:05.123 UTC" in audit
    pause_queue("mail")
    QueueState.objects.filter(name="mail").update(changed_at=at)
    queues = client.get("/admin/pgjobs/queuestate/").content.decode()
    assert "<td>2026-03-02 07:04:05.123 UTC</td>" in queues


def dashboard_health(client: Client) -> str:
    html = client.get(reverse("admin:pgjobs_job_dashboard")).content.decode()
    start = html.index('<div id="pgjobs-health">')
    return html[start:html.index("</div>", start)]


def test_a_quiet_dashboard_says_what_it_checked_and_that_no_backlog_policy_is_set(
    login: Any,
) -> None:
    from django_pgjobs.workers import Heartbeat

    JobFactory(queue="mail")
    Heartbeat("w1", queues=None, concurrency=1, listens=False, running=lambda: 0)()
    health = dashboard_health(login("view_job"))
    assert ("1 live worker serving every queue with ready jobs; no expired leases, nothing "
            "holding vacuum back, no late schedules, no paused queue; no backlog policy is set "
            "(PGJOBS_BACKLOG_MAX_AGE_SECONDS), so backlog age is not checked.") in health
    assert "within" not in health
    with override_settings(PGJOBS_BACKLOG_MAX_AGE_SECONDS={"mail": 60}):
        assert "every queue with a backlog policy is within it." in dashboard_health(
            login("view_job", username="op2"))


@override_settings(PGJOBS_BACKLOG_MAX_AGE_SECONDS={"mail": 60}, PGJOBS_SCHEDULE_GRACE_SECONDS=60)
def test_the_dashboard_health_names_each_problem(login: Any) -> None:
    from tests.factories import ScheduleFactory

    JobFactory.create_batch(2, queue="mail", run_at=timezone.now() - timedelta(minutes=5))
    JobFactory(queue="bulk", running=True, lease_expires_at=timezone.now() - timedelta(seconds=5))
    pause_queue("reports")
    ScheduleFactory(name="ops.late", next_tick_at=timezone.now() - timedelta(minutes=10))
    health = dashboard_health(login("view_job"))
    items = [line.rsplit('class="pgjobs-unhealthy">', 1)[1] for line in health.split("</li>")[:-1]]
    assert len(items) == 5
    # First, whether anything runs the work at all: no worker has run here.
    assert items[0] == ("Queue mail has 2 jobs ready and no live worker serving it: no worker "
                        "is live.")
    assert items[1].startswith("Queue mail: the oldest ready job has waited 5m ")
    assert items[1].endswith(", over its backlog policy of 1m 0s.")
    assert items[2:] == [
        "1 job still running with an expired lease: the worker is gone or stalled, and the "
        "rescue step has not retried or ended them yet.",
        "1 late schedule: ops.late.",
        "Queue reports is paused: workers claim none of its jobs.",
    ]


def test_a_queue_with_only_finished_jobs_is_listed_beside_its_pickup_latency(login: Any) -> None:
    job = JobFactory(queue="reports", succeeded=True, run_at=timezone.now() - timedelta(seconds=3))
    AttemptFactory(job=job, number=1, claimed_at=timezone.now() - timedelta(seconds=2))
    response = login("view_job").get(reverse("admin:pgjobs_job_dashboard"))
    assert [p.key for p in response.context["snapshot"].pickup_latency_seconds] == ["reports"]
    rows = {r.queue: r for r in response.context["queue_rows"]}
    assert [c.count for c in rows["reports"].cells] == [0, 0, 0, 0, 0, 0, 0]
    assert (rows["reports"].policy, rows["reports"].paused) == ("none", False)
    with override_settings(PGJOBS_BACKLOG_MAX_AGE_SECONDS={"*": 90}):
        rows = {r.queue: r for r in login("view_job", username="op2").get(
            reverse("admin:pgjobs_job_dashboard")).context["queue_rows"]}
    assert rows["reports"].policy == "1m 30s"


# --- wording ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("made", "said"), [
    ({"ready": 2}, "Cancelled 2 jobs."),
    ({"running": 1}, "Asked 1 job (running) to stop."),
    ({"ready": 1, "running": 2}, "Cancelled 1 job; asked 2 jobs (running) to stop."),
])
def test_the_cancel_message_names_only_what_happened(
    login: Any, made: dict[str, int], said: str
) -> None:
    client = login("view_job", "cancel_job")
    jobs = [JobFactory() for _ in range(made.get("ready", 0))] + [
        JobFactory(running=True) for _ in range(made.get("running", 0))]
    response = client.post(CHANGELIST, {
        "action": "cancel_selected", "_selected_action": jobs[0].pk, "pgjobs_confirm": "yes",
        "pgjobs_ids": ",".join(str(j.pk) for j in jobs), "reason": ""}, follow=True)
    assert [str(m).split(" Selected: ")[0] for m in response.context["messages"]] == [said]


def breadcrumbs(page: str) -> list[str]:
    """The breadcrumb trail's words, as Django 5.2 (``&rsaquo;``) and 6 (a list) write it."""
    trail = re.search(
        r'<(?:div class="breadcrumbs"|nav aria-label="Breadcrumbs")>(.*?)</(?:div|nav)>',
        page, re.S)
    assert trail is not None, "no breadcrumbs"
    words = re.sub(r"<[^>]+>|&rsaquo;", "\n", trail.group(1))
    return [w.strip() for w in words.split("\n") if w.strip()]


def test_the_pages_say_things_the_way_operators_read_them(login: Any) -> None:
    j = JobFactory(task="tests.admin.charge", payload=secret_payload())
    AttemptFactory(job=j, number=1, failure_class="lease_expired", outcome="lease_expired",
                   claimed_at=timezone.now())
    client = login(superuser=True)
    client.post(f"{CHANGELIST}{j.pk}/raw-payload/")
    audit = OperatorAction.objects.get()
    audit_page = client.get(f"/admin/pgjobs/operatoraction/{audit.pk}/change/").content.decode()
    assert "<title>view raw payload by op | View operator action" in audit_page
    assert "view_raw_payload" not in audit_page.split("<body")[0]
    # The breadcrumb names the app, then the list: not "Jobs > Jobs".
    listing = client.get(CHANGELIST).content.decode()
    assert breadcrumbs(listing) == ["Home", "Job queue", "Jobs"]
    assert '<a href="/admin/pgjobs/">Job queue</a>' in listing
    # No link to Django's change history, which is always empty here; its URL shows the record.
    page = client.get(f"{CHANGELIST}{j.pk}/change/").content.decode()
    assert "historylink" not in page and "pgjobs-raw-payload-link" in page
    history = client.get(f"{CHANGELIST}{j.pk}/history/")
    assert (history.status_code, history["Location"]) == (302, f"{CHANGELIST}{j.pk}/change/")
    # Failure classes by their label on the dashboard too.
    dashboard = client.get(reverse("admin:pgjobs_job_dashboard"))
    assert dashboard.context["failure_totals"] == [("lease expired", 1)]
    # (A link may carry the code in its query string; the text an operator reads does not.)
    assert "lease_expired" not in re.sub(r'href="[^"]*"', "", dashboard.content.decode())


def test_every_confirmation_has_the_same_buttons(login: Any) -> None:
    j = JobFactory(dead=True)
    client = login(superuser=True)
    pages = [
        start_action(client, "retry_selected", [j]).content.decode(),
        client.post("/admin/pgjobs/queuestate/", {"action": "pause", "queue": "mail"}
                    ).content.decode(),
        client.get(f"{CHANGELIST}{j.pk}/raw-payload/").content.decode(),
    ]
    for page, yes in zip(pages, ("Yes, retry jobs", "Yes, pause queue mail",
                                 "Yes, show the raw payload"), strict=True):
        row = page[page.index('<div class="submit-row">'):]
        row = row[:row.index("</div>")]
        assert f'value="{yes}"' in row, row
        assert 'class="button cancel-link">No, take me back</a>' in row, row
