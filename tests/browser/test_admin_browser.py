"""The admin as an operator sees it, in a real browser: redaction, actions, 403, dashboard."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from playwright.sync_api import Page, expect

from django_pgjobs import job
from django_pgjobs.models import Job, OperatorAction
from django_pgjobs.status import JobStatus
from tests.browser.conftest import PASSWORD, log_in
from tests.factories import AttemptFactory, JobFactory

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SECRET_CARD = "4111111111111111"
SECRET_EMAIL = "ada@example.com"
OPERATOR_ACTIONS = ["retry_selected", "run_now_selected", "replay_selected", "cancel_selected",
                    "dead_letter_selected"]


@job("tests.browser.charge", redact=("customer.email",))
def charge(ctx: Any, payload: Any) -> None:
    """A handler whose payload carries secrets."""


def user(username: str, *codenames: str, superuser: bool = False) -> User:
    made = User.objects.create_user(username, password=PASSWORD, is_staff=True,
                                    is_superuser=superuser)
    made.user_permissions.set(
        Permission.objects.filter(content_type__app_label="pgjobs", codename__in=codenames)
    )
    return made


def dead_charge() -> Job:
    failed = JobFactory(
        task="tests.browser.charge", dead=True,
        payload={"order": 7, "card_number": SECRET_CARD, "customer": {"email": SECRET_EMAIL}},
        last_error=f"CardError: card {SECRET_CARD} declined for {SECRET_EMAIL}",
    )
    AttemptFactory(job=failed, number=1, outcome="dead", failure_class="permanent",
                   error=f"declined {SECRET_CARD}", worker_id="worker-1", duration_ms=42)
    return failed


def action_options(page: Page) -> list[str]:
    return [o for o in page.locator("select[name=action] option").evaluate_all(
        "options => options.map(o => o.value)") if o]


def test_a_superuser_sees_redacted_payloads_and_every_action(
    live_server: Any, page: Page, screenshot: Callable[[str], Path]
) -> None:
    user("root", superuser=True)
    failed = dead_charge()
    log_in(page, live_server.url, "root")

    expect(page.locator("#result_list")).to_contain_text("[redacted]")
    assert SECRET_CARD not in page.content() and SECRET_EMAIL not in page.content()
    assert action_options(page) == [*OPERATOR_ACTIONS, "export_selected"]
    screenshot("list")

    page.click(f"a[href$='/admin/pgjobs/job/{failed.pk}/change/']")
    expect(page.locator("body")).to_contain_text("CardError: card [redacted] declined")
    expect(page.locator("#pgjobs-raw-payload-link")).to_be_visible()
    assert SECRET_CARD not in page.content() and SECRET_EMAIL not in page.content()
    screenshot("detail")

    page.goto(f"{live_server.url}/admin/pgjobs/job/")
    page.check(f"input[name=_selected_action][value='{failed.pk}']")
    page.select_option("select[name=action]", "retry_selected")
    page.click("button[name=index]")
    expect(page.locator("#pgjobs-changes")).to_contain_text(
        "1 job (1 dead) will go back to ready now")
    screenshot("retry-confirmation")
    page.fill("textarea[name=reason]", "card network back up")
    page.click("#pgjobs-confirm")
    expect(page.locator("ul.messagelist")).to_contain_text("Retried 1 job")
    screenshot("retried")
    assert Job.objects.get(pk=failed.pk).status == JobStatus.READY
    audit = OperatorAction.objects.get()
    assert (audit.actor_name, audit.action, audit.reason, audit.changed) == (
        "root", "retry", "card network back up", 1)


def test_a_view_only_staff_user_sees_no_operator_action(
    live_server: Any, page: Page, screenshot: Callable[[str], Path]
) -> None:
    user("viewer", "view_job", "view_attempt")
    failed = dead_charge()
    log_in(page, live_server.url, "viewer")

    assert action_options(page) == ["export_selected"]
    expect(page.locator("#result_list")).to_contain_text("[redacted]")
    screenshot("list")
    page.goto(f"{live_server.url}/admin/pgjobs/job/{failed.pk}/change/")
    expect(page.locator("#pgjobs-raw-payload-link")).to_have_count(0)
    screenshot("detail")


def test_a_forged_action_post_is_refused(
    live_server: Any, page: Page, screenshot: Callable[[str], Path]
) -> None:
    user("viewer", "view_job")
    failed = dead_charge()
    log_in(page, live_server.url, "viewer")

    # The viewer's own session and CSRF token, posting an action the page never offered.
    statuses = page.evaluate(
        """async ([jobId]) => {
            const token = document.querySelector("input[name=csrfmiddlewaretoken]").value;
            const post = async (fields) => {
                const body = new URLSearchParams({csrfmiddlewaretoken: token, ...fields});
                const response = await fetch(location.pathname, {method: "POST", body});
                return response.status;
            };
            return [
                await post({action: "retry_selected", index: "0", _selected_action: jobId}),
                await post({action: "retry_selected", _selected_action: jobId,
                            pgjobs_ids: jobId, pgjobs_confirm: "yes"}),
            ];
        }""",
        [str(failed.pk)],
    )
    assert statuses == [403, 403]
    refused = page.goto(f"{live_server.url}/admin/pgjobs/job/{failed.pk}/raw-payload/")
    assert refused is not None and refused.status == 403
    # The admin's own page, saying which permission is missing.
    expect(page.locator("#site-name")).to_be_visible()
    expect(page.locator("#pgjobs-permission-needed")).to_contain_text(
        "pgjobs.view_raw_payload")
    screenshot("raw-payload-refused")
    assert Job.objects.get(pk=failed.pk).status == JobStatus.DEAD
    assert OperatorAction.objects.count() == 0


def test_the_dashboard_renders(
    live_server: Any, page: Page, screenshot: Callable[[str], Path]
) -> None:
    user("viewer", "view_job")
    JobFactory.create_batch(3, queue="mail")
    JobFactory(queue="mail", running=True)
    dead_charge()
    log_in(page, live_server.url, "viewer")

    page.click("#pgjobs-dashboard-link")
    expect(page.locator("h1")).to_have_text("Job queue dashboard")
    mail = page.locator("#pgjobs-queues tr", has_text="mail")
    expect(mail.locator("td").nth(0)).to_have_text("3")  # ready
    expect(mail.locator("td").nth(1)).to_have_text("0")  # throttled
    expect(mail.locator("td").nth(3)).to_have_text("1")  # running
    expect(page.locator("svg#pgjobs-history-all")).to_be_visible()
    expect(page.locator("#pgjobs-failures")).to_be_visible()
    screenshot("dashboard")


def test_the_workers_page_and_the_dashboard_say_which_queue_no_live_worker_serves(
    live_server: Any, page: Page, screenshot: Callable[[str], Path]
) -> None:
    from django_pgjobs.workers import Heartbeat

    user("viewer", "view_job", "view_workerprocess")
    Heartbeat("web-1:4242:abc", queues=["mail"], concurrency=4, listens=False,
              running=lambda: 2)()
    stopped = Heartbeat("web-2:77:def", queues=None, concurrency=8, listens=False,
                        running=lambda: 0)
    stopped()
    stopped.stopped()
    JobFactory.create_batch(2, queue="reports")
    log_in(page, live_server.url, "viewer")
    page.set_viewport_size({"width": 1366, "height": 900})

    page.click("#pgjobs-dashboard-link")
    expect(page.locator("#pgjobs-health li").first).to_have_text(
        "Queue reports has 2 jobs ready and no live worker serving it: none of the 1 live "
        "worker serves it.")
    expect(page.locator("#pgjobs-workers tr", has_text="web-1:4242:abc")).to_contain_text("live")
    page.click("#pgjobs-workers a")  # all workers
    expect(page.locator("h1")).to_have_text("Workers")
    rows = page.locator("#pgjobs-workers tbody tr")
    expect(rows.nth(0)).to_contain_text("web-1:4242:abc")
    expect(rows.nth(0)).to_contain_text("mail")
    expect(rows.nth(1)).to_contain_text("stopped")
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    screenshot("workers")


def test_a_job_waiting_out_its_backoff_is_run_now_from_its_own_page(
    live_server: Any, page: Page, screenshot: Callable[[str], Path]
) -> None:
    from datetime import timedelta

    from django.utils import timezone

    user("op", "view_job", "retry_job")
    waiting = JobFactory(retrying=True, run_at=timezone.now() + timedelta(minutes=10))
    log_in(page, live_server.url, "op")
    page.goto(f"{live_server.url}/admin/pgjobs/job/{waiting.pk}/change/")
    buttons = page.locator("#pgjobs-job-actions button")
    expect(buttons).to_have_text(["Run now"])
    buttons.first.click()
    expect(page.locator("#pgjobs-changes")).to_contain_text(
        "1 job (1 retrying) will be due now instead of at their time")
    screenshot("run-now-plan")
    page.fill("textarea[name=reason]", "the API is back")
    page.click("#pgjobs-confirm")
    expect(page.locator("ul.messagelist")).to_contain_text("Made 1 job due now.")
    assert Job.objects.get(pk=waiting.pk).status == JobStatus.READY
    assert OperatorAction.objects.get().action == "run_now"


def test_an_encrypted_field_shows_as_encrypted_until_an_audited_reveal(
    live_server: Any, page: Page, screenshot: Callable[[str], Path]
) -> None:
    from django_pgjobs import enqueue

    card, token = "4000000000000077", "tok_live_browser"
    sealed = enqueue("tests.encrypted_charge", {"order": 9, "card": {"number": card},
                                                "token": token})
    user("keeper", "view_job", "view_raw_payload", "reveal_encrypted")
    log_in(page, live_server.url, "keeper")
    page.goto(f"{live_server.url}/admin/pgjobs/job/{sealed.pk}/change/")
    expect(page.locator("body")).to_contain_text("[encrypted, key ")
    assert card not in page.content() and token not in page.content()
    screenshot("encrypted-detail")

    page.click("#pgjobs-raw-payload-link")
    expect(page.locator("#pgjobs-reveal-form")).to_contain_text("stay encrypted")
    page.click("#pgjobs-reveal")  # the raw payload: its encrypted fields still encrypted
    expect(page.locator("#pgjobs-sealed")).to_contain_text("payload.card.number, payload.token")
    assert card not in page.content() and token not in page.content()
    assert not OperatorAction.objects.filter(action="reveal_encrypted").exists()

    page.goto(f"{live_server.url}/admin/pgjobs/job/{sealed.pk}/raw-payload/")
    page.click("#pgjobs-decrypt")
    expect(page.locator("#pgjobs-decrypted")).to_be_visible()
    expect(page.locator("#pgjobs-raw-payload")).to_contain_text(card)
    screenshot("encrypted-revealed")
    reveal = OperatorAction.objects.get(action="reveal_encrypted")
    assert (reveal.actor_name, reveal.job_ids) == ("keeper", [sealed.pk])
