"""The operator console in a real browser, as on-call opens it: every view at 1366, 1920 and
390 px, for a superuser and for view-only staff; the history's charts; live updates; actions on
the schedule and queue pages."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import override_settings
from django.utils import timezone
from playwright.sync_api import Page, expect

from django_pgjobs import job, transitions
from django_pgjobs.admin.charts import STYLES
from django_pgjobs.models import Job, KeyLimit, OperatorAction, QueueSample
from django_pgjobs.status import JobStatus
from django_pgjobs.workers import Heartbeat
from tests.browser.conftest import PASSWORD, log_in
from tests.factories import AttemptFactory, JobFactory, ReceiptFactory, ScheduleFactory

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

WIDTHS = (1366, 1920, 390)
SECRET = "4111111111111111"
# Every view of the console, by the path after /admin/pgjobs/ ({job}, {schedule}: ids).
VIEWS = {
    "dashboard": "job/dashboard/",
    "dashboard-24h": "job/dashboard/?range=24h",
    "dashboard-7d": "job/dashboard/?range=7d",
    "jobs": "job/",
    "dead": "job/?status__exact=dead",
    "job": "job/{job}/change/",
    "workflow job": "job/{workflow}/change/",
    "workers": "workerprocess/",
    "queues": "queuestate/",
    "schedules": "schedule/",
    "schedule": "schedule/{schedule}/change/",
    "limits": "keylimit/",
    "audit": "operatoraction/",
    "receipts": "idempotencyreceipt/",
    "attempts": "attempt/",
}


@job("tests.browser.console_charge", redact=("customer.email",))
def charge(ctx: Any, payload: Any) -> None:
    """A handler whose payload and errors carry secrets."""


def user(username: str, *, superuser: bool = False) -> User:
    made = User.objects.create_user(username, password=PASSWORD, is_staff=True,
                                    is_superuser=superuser)
    if not superuser:  # view-only staff: every view permission of the app, nothing else
        made.user_permissions.set(Permission.objects.filter(
            content_type__app_label="pgjobs", codename__startswith="view_")
            .exclude(codename="view_raw_payload"))
    return made


def console_data() -> dict[str, int]:
    """What an operator finds at 3 a.m.: several queues, a backlog, failures with secrets in
    them, a live worker and a gone one, schedules, limits, receipts, audit rows, a week of
    history in which one burst dwarfs the steady flow."""
    now = timezone.now()
    wide_payload = {"order": 7, "card_number": SECRET, "customer": {"email": "ada@example.com",
                    "name": "Ada", "address": {"street": "1 Long Road", "city": "Leeds"}},
                    "lines": [{"sku": "A-1", "qty": 2}, {"sku": "B-22", "qty": 1}],
                    "note": "leave at the door " * 6, "reference": "ref-" + "0123456789" * 30}
    for queue in ("default", "mail", "reports", "billing-eu-west-long-queue-name"):
        JobFactory.create_batch(3, queue=queue, payload=wide_payload,
                                run_at=now - timedelta(minutes=7))
    JobFactory(queue="mail", running=True, payload=wide_payload)
    waiting = JobFactory(queue="mail", retrying=True, run_at=now + timedelta(minutes=10),
                         payload=wide_payload)
    for n in range(3):
        dead = JobFactory(task="tests.browser.console_charge", queue="mail", dead=True,
                          payload=wide_payload,
                          last_error=f"CardError: card {SECRET} declined (order {n})")
        AttemptFactory(job=dead, number=1, outcome="dead", failure_class="permanent",
                       error=f"CardError: card {SECRET} declined (order {n})",
                       finished_at=now - timedelta(minutes=n))
    JobFactory.create_batch(2, queue="reports", succeeded=True, payload=wide_payload)
    Heartbeat("web-1.internal.example:4242:abc123", queues=["mail", "default"], concurrency=8,
              listens=False, running=lambda: 1)()
    gone = Heartbeat("web-2:77:def", queues=None, concurrency=4, listens=False,
                     running=lambda: 0)
    gone()
    gone.stopped()
    schedule = ScheduleFactory(name="nightly-report-for-every-customer-account", task="demo.noop",
                               cron="0 3 * * *", payload={"region": "eu", "full": True})
    ScheduleFactory(name="hourly-sync", task="demo.noop", cron="0 * * * *",
                    paused_at=now)
    KeyLimit.objects.create(key="customer:42", max_running=2)
    ReceiptFactory.create_batch(2)
    transitions.pause_queue("reports", reason="upstream maintenance window")
    # A week of samples: a steady 12 a minute in mail, one 3,000 burst an hour ago.
    with connection.cursor() as cursor:
        cursor.execute("SELECT date_bin(interval '60 seconds', now(), "
                       "timestamptz '2000-01-01')")
        at = cursor.fetchone()[0]
    QueueSample.objects.bulk_create([
        QueueSample(sampled_at=at - timedelta(minutes=m), queue="mail", ready=5 + m % 7,
                    running=2, succeeded=3000 if m == 60 else 12, failed=1 if m % 30 == 0 else 0,
                    oldest_ready_seconds=30 + m % 50)
        for m in range(0, 7 * 24 * 60, 10)
    ] + [
        QueueSample(sampled_at=at - timedelta(minutes=m), queue="default", ready=m % 3,
                    succeeded=m % 5) for m in range(0, 120)
    ])
    # A workflow: a chain whose middle reports progress, and a chord of six behind it.
    from django_pgjobs import JobSpec, chain, chord, enqueue_many

    head, middle, *_ = flow = enqueue_many([
        *chain(JobSpec.of("demo.noop", {"step": "extract"}),
               JobSpec.of("demo.noop", {"step": "transform"})),
        *chord([JobSpec.of("demo.noop", {"part": n}) for n in range(6)],
               JobSpec.of("demo.noop", {"step": "publish"})),
    ])
    Job.objects.filter(pk=middle.pk).update(
        progress={"done": 412, "total": 1000, "message": "transforming rows"})
    assert len(flow) == 9 and head.status == "ready"
    return {"job": waiting.pk, "schedule": schedule.pk, "workflow": middle.pk}


def page_problems(page: Page, *, whole_tables: bool) -> list[str]:
    """What does not fit: the page scrolling sideways, a table cut off by a box that cannot
    scroll to it (and, with ``whole_tables``, any table not shown whole), text under 11 px."""
    return page.evaluate(
        """(wholeTables) => {
            const problems = [];
            const root = document.documentElement;
            if (root.scrollWidth > window.innerWidth + 1) {
                problems.push(`page is ${root.scrollWidth}px wide in ${window.innerWidth}px`);
            }
            // A table or a block of text is cut when it runs past the box that holds it
            // and that box cannot scroll to the rest (or past the screen, held by none).
            for (const el of document.querySelectorAll("#content table, #content pre")) {
                if (el.offsetParent === null) continue;  // hidden
                const name = el.id || el.className || el.tagName.toLowerCase();
                let box = el.parentElement;
                while (box && box !== document.body
                       && getComputedStyle(box).overflowX === "visible") {
                    box = box.parentElement;
                }
                const right = el.getBoundingClientRect().right;
                const held = box && box !== document.body;
                const limit = held ? box.getBoundingClientRect().right : window.innerWidth;
                const scrolls = held
                    && ["auto", "scroll"].includes(getComputedStyle(box).overflowX);
                if (el.scrollWidth > el.clientWidth + 1) {  // it holds more than it shows
                    const own = getComputedStyle(el).overflowX;
                    if (!["auto", "scroll"].includes(own)) {
                        problems.push(`${name} cuts its own content at ${el.clientWidth}px`);
                    } else if (wholeTables) {
                        problems.push(`${name} is not whole: it scrolls past ${el.clientWidth}px`);
                    }
                }
                if (right > limit + 1 && !scrolls) {
                    problems.push(`${name} cut: it ends at ${Math.round(right)}px, its box ` +
                                  `at ${Math.round(limit)}px`);
                } else if (right > limit + 1 && wholeTables) {
                    problems.push(`${name} is not whole: it scrolls past ${Math.round(limit)}px`);
                }
            }
            for (const el of document.querySelectorAll("#content *")) {
                const own = [...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
                if (!own || el.offsetParent === null && el.tagName !== "text") continue;
                const size = parseFloat(getComputedStyle(el).fontSize);
                const scale = el.ownerSVGElement
                    ? el.ownerSVGElement.getBoundingClientRect().width
                      / el.ownerSVGElement.viewBox.baseVal.width : 1;
                if (size * scale < 10.5) {
                    problems.push(`${el.tagName} "${el.textContent.trim().slice(0, 30)}" is ` +
                                  `${(size * scale).toFixed(1)}px`);
                }
            }
            return problems;
        }""",
        whole_tables,
    )


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("who", ["root", "viewer"])
def test_every_view_fits_the_screen_and_shows_no_secret(
    live_server: Any, page: Page, screenshot: Callable[[str], Path], width: int, who: str,
) -> None:
    user(who, superuser=who == "root")
    ids = console_data()
    log_in(page, live_server.url, who)
    page.set_viewport_size({"width": width, "height": 900})
    for name, path in VIEWS.items():
        response = page.goto(f"{live_server.url}/admin/pgjobs/{path.format(**ids)}")
        assert response is not None and response.status == 200, (name, response)
        expect(page.locator("#content")).to_be_visible()
        if width != 1920:
            screenshot(f"{name}-{width}")
        problems = page_problems(page, whole_tables=width >= 1366)
        assert not problems, f"{name} at {width}px: " + "; ".join(problems[:8])
        assert SECRET not in page.content(), name


def test_the_history_charts_each_queue_on_a_log_scale_in_utc(
    live_server: Any, page: Page, screenshot: Callable[[str], Path],
) -> None:
    user("viewer")
    console_data()
    log_in(page, live_server.url, "viewer")
    page.goto(f"{live_server.url}/admin/pgjobs/job/dashboard/?range=24h")
    expect(page.locator("#pgjobs-history-ranges strong")).to_have_text("last 24h")
    for chart in ("pgjobs-history-all", "pgjobs-history-mail", "pgjobs-wait-mail",
                  "pgjobs-history-default"):
        expect(page.locator(f"svg#{chart}")).to_be_visible()
    mail = page.locator("svg#pgjobs-history-mail")
    # The burst and the steady flow on one chart: a log scale's labels, 12 still off the floor.
    assert mail.locator("text").all_text_contents()[:5] == ["0", "1", "10", "100", "1k"]
    expect(mail).to_have_attribute("aria-label", re.compile(
        r"Jobs in queue mail, log scale, UTC: ready \(peak\): peak \d+; .*succeeded per "
        r"minute: peak 200"))  # 3,000 in one minute of a quarter hour's bucket
    caption = page.locator("figure", has=mail).locator("figcaption")
    expect(caption).to_contain_text("log scale, UTC")
    expect(caption.locator("li")).to_have_text([
        "ready (peak)", "running (peak)", "scheduled, retrying, throttled or pending (peak)",
        "succeeded per minute", "failed attempts per minute"])
    page.click("#pgjobs-history-ranges a:text('last 7d')")
    expect(page.locator("#pgjobs-history-ranges strong")).to_have_text("last 7d")
    screenshot("history-7d")


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_chart_lines_stand_three_to_one_against_the_page_and_differ_by_more_than_colour(
    live_server: Any, page: Page, scheme: str,
) -> None:
    user("viewer")
    console_data()
    page.emulate_media(color_scheme=scheme)  # type: ignore[arg-type]
    log_in(page, live_server.url, "viewer")
    page.goto(f"{live_server.url}/admin/pgjobs/job/dashboard/")
    background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    strokes = page.locator("svg#pgjobs-history-mail path").evaluate_all(
        "paths => paths.map(p => [p.getAttribute('stroke'), p.getAttribute('stroke-dasharray')])")
    assert len(strokes) == 5
    assert len({dash for _, dash in strokes}) == 5  # each line its own pattern, too
    for colour, _ in strokes:
        assert contrast(colour, background) >= 3.0, (colour, background, scheme)
    assert {colour for colour, _ in strokes} <= {c for c, _ in STYLES.values()}


def contrast(hex_colour: str, css_background: str) -> float:
    def channel(c: float) -> float:
        c /= 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    def luminance(rgb: tuple[float, ...]) -> float:
        r, g, b = (channel(c) for c in rgb)
        return 0.2126 * r + 0.7152 * g + 0.0722 * b

    fg = tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    bg = tuple(float(n) for n in re.findall(r"[\d.]+", css_background)[:3])
    high, low = sorted((luminance(fg), luminance(bg)), reverse=True)
    return (high + 0.05) / (low + 0.05)


@override_settings(PGJOBS_ADMIN_REFRESH_SECONDS=2)
def test_the_dashboard_refreshes_itself_until_stopped_and_waits_while_hidden(
    live_server: Any, page: Page,
) -> None:
    user("viewer")
    # The tab's visibility, as the test sets it (document.hidden is read-only in a page).
    page.context.add_init_script("Object.defineProperty(document, 'hidden', {configurable: true, "
                                 "get: () => sessionStorage.getItem('hide') === '1'})")
    log_in(page, live_server.url, "viewer")

    def stays(seconds: float) -> bool:
        """Whether the page is the same document after ``seconds`` (no reload)."""
        page.evaluate("window.pgjobsMark = 1")
        page.wait_for_timeout(seconds * 1000)
        return page.evaluate("window.pgjobsMark === 1")

    page.goto(f"{live_server.url}/admin/pgjobs/job/dashboard/")
    page.click("#pgjobs-live-toggle")  # at once: the first reload is two seconds away
    expect(page.locator("#pgjobs-live-toggle")).to_have_text("Start live updates")
    expect(page.locator("#pgjobs-live-note")).to_have_text("Live updates are stopped.")
    assert stays(3.5)
    page.reload()  # the choice outlives the page
    expect(page.locator("#pgjobs-live-toggle")).to_have_attribute("aria-pressed", "false")
    assert stays(3.5)

    page.evaluate("sessionStorage.setItem('hide', '1')")
    page.click("#pgjobs-live-toggle")
    expect(page.locator("#pgjobs-live-toggle")).to_have_attribute("aria-pressed", "true")
    assert stays(3.5)  # a hidden tab waits
    with page.expect_navigation(timeout=5000):  # shown again, it is due: it reloads
        page.evaluate("sessionStorage.setItem('hide', '0')")
    JobFactory(queue="arrived-later")
    expect(page.locator("#pgjobs-queues")).to_contain_text("arrived-later", timeout=8000)


@override_settings(PGJOBS_ADMIN_REFRESH_SECONDS=1)
def test_the_job_list_waits_while_the_operator_has_jobs_ticked(
    live_server: Any, page: Page,
) -> None:
    user("root", superuser=True)
    job = JobFactory()
    log_in(page, live_server.url, "root")
    page.check(f"input[name=_selected_action][value='{job.pk}']")
    page.evaluate("window.pgjobsMark = 1")
    page.wait_for_timeout(2500)
    assert page.evaluate("window.pgjobsMark === 1")
    page.uncheck(f"input[name=_selected_action][value='{job.pk}']")
    page.wait_for_function("window.pgjobsMark === undefined", timeout=5000)


@pytest.mark.parametrize("width", WIDTHS)
def test_a_schedule_is_paused_and_run_from_its_own_page(
    live_server: Any, page: Page, screenshot: Callable[[str], Path], width: int,
) -> None:
    user("root", superuser=True)
    schedule = ScheduleFactory(name="nightly", task="demo.noop", cron="0 3 * * *")
    log_in(page, live_server.url, "root")
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(f"{live_server.url}/admin/pgjobs/schedule/{schedule.pk}/change/")
    expect(page.locator("#pgjobs-schedule-actions button")).to_have_text(["Run now", "Pause"])
    assert page_problems(page, whole_tables=width >= 1366) == [], width
    page.click("#pgjobs-schedule-pause_selected")
    expect(page.locator("#pgjobs-changes")).to_contain_text("1 schedule (active) will stop")
    assert page_problems(page, whole_tables=width >= 1366) == [], width
    screenshot(f"pause-plan-{width}")
    page.fill("textarea[name=reason]", "vendor outage")
    page.click("#pgjobs-confirm")
    expect(page.locator("ul.messagelist")).to_contain_text("Paused 1 schedule.")
    schedule.refresh_from_db()
    assert schedule.state == "paused"
    page.goto(f"{live_server.url}/admin/pgjobs/schedule/{schedule.pk}/change/")
    expect(page.locator("#pgjobs-schedule-actions button")).to_have_text(["Run now", "Resume"])
    page.click("#pgjobs-schedule-run_now_selected")
    page.click("#pgjobs-confirm")
    expect(page.locator("ul.messagelist")).to_contain_text("Enqueued 1 job")
    assert Job.objects.filter(schedule=schedule).count() == 1
    assert list(OperatorAction.objects.order_by("id").values_list("action", flat=True)) == [
        "schedule_pause", "schedule_run_now"]


@pytest.mark.parametrize(("state", "button", "plan", "done", "after"), [
    ("ready", "cancel_selected", "will be cancelled", "Cancelled 1", JobStatus.CANCELLED),
    ("ready", "dead_letter_selected", "will move to dead now", "Moved 1 job to dead",
     JobStatus.DEAD),
    ("dead", "retry_selected", "will go back to ready", "Retried 1", JobStatus.READY),
    ("dead", "replay_selected", "new job", "Replayed 1", JobStatus.DEAD),
])
@pytest.mark.parametrize("width", WIDTHS)
def test_each_action_on_a_jobs_page_shows_its_plan_then_acts(
    live_server: Any, page: Page, state: str, button: str, plan: str, done: str, after: str,
    width: int,
) -> None:
    user("root", superuser=True)
    target = JobFactory(dead=True) if state == "dead" else JobFactory()
    log_in(page, live_server.url, "root")
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(f"{live_server.url}/admin/pgjobs/job/{target.pk}/change/")
    page.click(f"#pgjobs-job-{button}")
    expect(page.locator("#pgjobs-changes")).to_contain_text(plan)
    assert page_problems(page, whole_tables=width >= 1366) == [], width  # the plan fits too
    page.fill("textarea[name=reason]", "on-call")
    if button == "replay_selected":  # the replay asks what becomes of the idempotency key
        page.check("input[name=key_choice][value=none]")
    page.click("#pgjobs-confirm")
    expect(page.locator("ul.messagelist")).to_contain_text(done)
    assert Job.objects.get(pk=target.pk).status == after
    assert OperatorAction.objects.get().reason == "on-call"
    assert Job.objects.count() == (2 if button == "replay_selected" else 1)


def test_a_queue_is_paused_and_resumed_from_the_queue_page(live_server: Any, page: Page) -> None:
    user("root", superuser=True)
    JobFactory(queue="mail")
    log_in(page, live_server.url, "root")
    page.goto(f"{live_server.url}/admin/pgjobs/queuestate/")
    for action, state in (("pause", "paused"), ("resume", "active")):
        page.locator(f"#pgjobs-queue-mail button[value={action}]").click()
        page.fill("textarea[name=reason]", "maintenance")
        page.click("#pgjobs-queue-confirm-button")
        expect(page.locator("ul.messagelist")).to_contain_text(f"Queue mail: {state}.")
        expect(page.locator("#pgjobs-queue-mail .pgjobs-status")).to_have_text(state)
    assert list(OperatorAction.objects.order_by("id").values_list("action", flat=True)) == [
        "pause_queue", "resume_queue"]


def test_a_view_only_user_sees_no_action_on_the_schedule_and_queue_pages(
    live_server: Any, page: Page,
) -> None:
    user("viewer")
    schedule = ScheduleFactory(name="nightly", task="demo.noop", cron="0 3 * * *")
    JobFactory(queue="mail", retrying=True, run_at=timezone.now() + timedelta(minutes=5))
    log_in(page, live_server.url, "viewer")
    page.goto(f"{live_server.url}/admin/pgjobs/schedule/{schedule.pk}/change/")
    expect(page.locator("#content")).to_contain_text("nightly")
    expect(page.locator("#pgjobs-schedule-actions")).to_have_count(0)
    page.goto(f"{live_server.url}/admin/pgjobs/queuestate/")
    expect(page.locator("#pgjobs-queue-mail")).to_contain_text("1")
    expect(page.locator("#pgjobs-queues button")).to_have_count(0)


@pytest.mark.parametrize("width", WIDTHS)
def test_a_queues_jobs_waiting_out_a_backoff_are_run_now_from_the_queue_page(
    live_server: Any, page: Page, screenshot: Callable[[str], Path], width: int,
) -> None:
    user("root", superuser=True)
    later = timezone.now() + timedelta(minutes=10)
    waiting = JobFactory.create_batch(3, queue="mail", retrying=True, run_at=later)
    other = JobFactory(queue="reports", retrying=True, run_at=later)
    log_in(page, live_server.url, "root")
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(f"{live_server.url}/admin/pgjobs/queuestate/")
    page.locator("#pgjobs-queue-mail button[value=run_now]").click()
    expect(page.locator("#pgjobs-queue-confirm")).to_have_text("Run queue mail's waiting jobs now")
    assert page_problems(page, whole_tables=width >= 1366) == [], width
    expect(page.locator("#content")).to_contain_text("3 jobs of mail waiting for their time")
    screenshot(f"run-now-plan-{width}")
    page.fill("textarea[name=reason]", "the API is back")
    page.click("#pgjobs-queue-confirm-button")
    expect(page.locator("ul.messagelist")).to_contain_text("Queue mail: made 3 jobs due now.")
    assert {j.status for j in Job.objects.filter(pk__in=[j.pk for j in waiting])} == {
        JobStatus.READY}
    assert Job.objects.get(pk=other.pk).status == JobStatus.RETRYING
    audit = OperatorAction.objects.get()
    assert (audit.action, audit.changed, audit.reason) == ("run_now", 3, "the API is back")


def test_the_task_filter_narrows_as_the_operator_types(live_server: Any, page: Page) -> None:
    user("viewer")
    JobFactory()
    log_in(page, live_server.url, "viewer")
    tasks = page.locator("#pgjobs-filter-task li")
    total = tasks.count()
    assert total > 10
    page.fill("input[data-pgjobs-narrows=pgjobs-filter-task]", "tests.browser")
    visible = [t for t in tasks.all() if t.is_visible()]
    assert 1 < len(visible) < total
    assert visible[0].inner_text() == "All"
    assert all("tests.browser" in v.inner_text() for v in visible[1:])


# The operations guide's quick start shows these, numbered as its text explains them.
QUICK_START = {
    "dashboard": ("job/dashboard/", ["#pgjobs-health", "#pgjobs-workers", "#pgjobs-queues",
                                     "#pgjobs-history-ranges", "#pgjobs-error-groups"]),
    "dead-list": ("job/?status__exact=dead", ["#result_list thead th.column-reason_shown",
                                              "#result_list thead th.column-error_preview",
                                              "select[name=action]"]),
    "job": ("job/{job}/change/", ["#pgjobs-job-actions", "#pgjobs-raw-payload-link"]),
}
QUICK_START_SHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "quick-start"


def annotate(page: Page, selectors: list[str]) -> None:
    """Number each element as the guide does: a ring around it and its number beside it."""
    page.evaluate(
        """(selectors) => selectors.forEach((selector, i) => {
            const target = document.querySelector(selector);
            if (!target) throw new Error("nothing to annotate at " + selector);
            target.style.outline = "3px solid #e06b00";
            target.style.outlineOffset = "2px";
            const box = target.getBoundingClientRect();
            const badge = document.createElement("div");
            badge.textContent = String(i + 1);
            badge.className = "pgjobs-annotation";
            Object.assign(badge.style, {
                position: "absolute", left: `${Math.max(box.left + window.scrollX - 30, 0)}px`,
                top: `${box.top + window.scrollY - 4}px`, width: "24px", height: "24px",
                borderRadius: "12px", background: "#e06b00", color: "#fff",
                font: "bold 15px/24px sans-serif",
                textAlign: "center", zIndex: 1000,
            });
            document.body.appendChild(badge);
        })""",
        selectors,
    )


def test_the_quick_start_screenshots_number_what_the_guide_explains(
    live_server: Any, page: Page,
) -> None:
    user("root", superuser=True)
    ids = console_data()
    dead = Job.objects.filter(status=JobStatus.DEAD).values_list("pk", flat=True).first()
    log_in(page, live_server.url, "root")
    page.set_viewport_size({"width": 1366, "height": 900})
    QUICK_START_SHOTS.mkdir(parents=True, exist_ok=True)
    for name, (path, selectors) in QUICK_START.items():
        page.goto(f"{live_server.url}/admin/pgjobs/{path.format(**{**ids, 'job': dead})}")
        annotate(page, selectors)
        assert page.locator(".pgjobs-annotation").count() == len(selectors)
        page.screenshot(path=str(QUICK_START_SHOTS / f"{name}.png"))
