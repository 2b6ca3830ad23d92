"""The schedule admin: what operators see, what they may change, and the audit of each change."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from django_pgjobs import job
from django_pgjobs.models import Job, OperatorAction, Schedule
from django_pgjobs.redaction import REDACTED
from django_pgjobs.schedules import enqueue_due_ticks
from django_pgjobs.status import JobStatus, ScheduleSource
from tests.factories import ScheduleFactory

pytestmark = pytest.mark.django_db

LIST = "/admin/pgjobs/schedule/"
ACTIONS = ("pause_selected", "resume_selected", "run_now_selected")


@job("tests.admin.report", redact=("recipient",))
def report(ctx: Any, payload: Any) -> None:
    """A scheduled handler whose payload carries a secret."""


@job("tests.admin.receipt", redact=("customer.email",))
def receipt(ctx: Any, payload: Any) -> None:
    """A scheduled handler that hides its customer's email."""


@job("tests.admin.digest")
def digest(ctx: Any, payload: Any) -> None:
    """A scheduled handler that hides nothing."""


def choices(client: Client) -> set[str]:
    response = client.get(LIST)
    assert response.status_code == 200
    return {name for name, _ in response.context["action_form"].fields["action"].choices if name}


def start(client: Client, action: str, schedules: list[Schedule]) -> Any:
    return client.post(LIST, {"action": action, "index": 0,
                              "_selected_action": [s.pk for s in schedules]})


def confirm(client: Client, action: str, schedules: list[Schedule], **fields: Any) -> Any:
    return client.post(LIST, {
        "action": action, "_selected_action": schedules[0].pk, "pgjobs_confirm": "yes",
        "pgjobs_ids": ",".join(str(s.pk) for s in schedules), **fields,
    })


def fresh(schedule: Schedule) -> Schedule:
    return Schedule.objects.get(pk=schedule.pk)


def form_data(**overrides: Any) -> dict[str, Any]:
    data = {"name": "ops.nightly", "task": "tests.admin.report", "cron": "0 3 * * *",
            "timezone": "Europe/Paris", "payload": '{"recipient": "ops@example.com"}',
            "queue": "", "priority": "", "misfire": "skip", "catch_up_limit": "100",
            "overlap": "allow"}
    return {**data, **overrides}


# --- what operators see ------------------------------------------------------------------------


def test_the_list_shows_the_last_and_next_ticks_and_the_page_the_next_five(
    login,
) -> None:
    schedule = ScheduleFactory(name="ops.hourly", task="tests.admin.report", cron="0 * * * *",
                               timezone="Europe/Paris",
                               next_tick_at=datetime(2026, 10, 25, 0, 0, tzinfo=UTC))
    enqueue_due_ticks(now=datetime(2026, 10, 25, 0, 0, 5, tzinfo=UTC))
    job_row = Job.objects.get(schedule=schedule)
    Job.objects.filter(pk=job_row.pk).update(status=JobStatus.DEAD, finished_at=timezone.now(),
                                             terminal_reason="permanent_error")
    client = login("view_schedule", "view_job")
    page = client.get(LIST).content.decode()
    assert "ops.hourly" in page
    # The last tick, in the schedule's zone, said as every time in the admin is (time_text).
    assert "2026-10-25 02:00:00.000 CEST" in page
    # The next one in the list, the next five on the schedule's page, through the repeated
    # hour: 02:00 again, an hour later in CET.
    assert "2026-10-25 02:00:00.000 CET" in page and "03:00:00.000 CET" not in page
    detail = client.get(f"/admin/pgjobs/schedule/{schedule.pk}/change/").content.decode()
    for tick in ("2026-10-25 02:00:00.000 CET", "2026-10-25 03:00:00.000 CET",
                 "2026-10-25 04:00:00.000 CET", "2026-10-25 05:00:00.000 CET",
                 "2026-10-25 06:00:00.000 CET"):
        assert tick in detail
    # Its last job with that job's outcome, and all of its jobs.
    assert f'last <a href="/admin/pgjobs/job/{job_row.pk}/change/">#{job_row.pk}</a> dead' in page
    jobs = client.get(f"/admin/pgjobs/job/?schedule={schedule.pk}")
    assert [j.pk for j in jobs.context["cl"].result_list] == [job_row.pk]


def test_the_list_does_not_query_per_row(login, django_assert_max_num_queries) -> None:
    for _ in range(3):
        ScheduleFactory(last_job_id=Job.objects.create(
            task="tests.when", queue="default", payload={}, status="ready", max_attempts=1,
            lease_seconds=30).pk)
    client = login("view_schedule")
    client.get(LIST)
    with django_assert_max_num_queries(8):
        client.get(LIST)
    for _ in range(10):
        ScheduleFactory()
    with django_assert_max_num_queries(8):
        client.get(LIST)


def test_the_page_says_its_times_as_every_admin_page_does(login) -> None:
    schedule = ScheduleFactory(last_skipped_at=datetime(2026, 3, 1, 6, 5, 4, 321000, tzinfo=UTC))
    audit = OperatorAction.objects.create(action="schedule_pause", actor_name="alice",
                                          schedule_ids=[schedule.pk], reason="outage")
    OperatorAction.objects.filter(pk=audit.pk).update(
        created_at=datetime(2026, 3, 2, 7, 4, 5, 123000, tzinfo=UTC))
    page = login("view_schedule").get(f"{LIST}{schedule.pk}/change/").content.decode()
    assert "<li>2026-03-02 07:04:05.123 UTC pause schedule by alice outage</li>" in page
    assert "2026-03-01 06:05:04.321 UTC" in page  # the last skip


@pytest.mark.parametrize("state", ["paused", "retired"])
def test_a_schedule_that_will_not_tick_lists_no_next_ticks(login, state) -> None:
    ScheduleFactory(cron="0 3 * * *", **{f"{state}_at": timezone.now()})
    page = login("view_schedule").get(LIST).content.decode()
    assert f'<td class="field-next_tick_shown">{state}</td>' in page
    assert "03:00:00.000 UTC" not in page


def test_a_failing_schedule_shows_its_error_escaped_in_the_list_and_on_its_page(login) -> None:
    failing = ScheduleFactory(name="ops.failing", last_error="queue <b>gone</b> & refused",
                              last_error_at=datetime(2026, 3, 2, 7, 4, 5, 123000, tzinfo=UTC))
    ScheduleFactory(name="ops.fine")
    client = login("view_schedule")
    escaped = "queue &lt;b&gt;gone&lt;/b&gt; &amp; refused (2026-03-02 07:04:05.123 UTC)"
    page = client.get(LIST).content.decode()
    assert f"failing: {escaped}" in page
    assert "<b>gone</b>" not in page
    page = client.get(f"{LIST}{failing.pk}/change/").content.decode()
    assert f'<div class="readonly">{escaped}</div>' in page
    listed = client.get(LIST, {"state": "failing"}).context["cl"].result_list
    assert [s.name for s in listed] == ["ops.failing"]


def test_the_list_cuts_a_long_error_and_the_page_shows_it_whole(login) -> None:
    failing = ScheduleFactory(last_error="x" * 500, last_error_at=timezone.now())
    client = login("view_schedule")
    assert f"failing: {'x' * 119}…" in client.get(LIST).content.decode()
    assert "x" * 500 in client.get(f"{LIST}{failing.pk}/change/").content.decode()


def test_payloads_are_shown_redacted_to_viewers(login) -> None:
    schedule = ScheduleFactory(task="tests.admin.report",
                               payload={"recipient": "ceo@example.com", "day": "monday"})
    client = login("view_schedule")
    page = client.get(f"{LIST}{schedule.pk}/change/").content.decode()
    assert "ceo@example.com" not in page
    assert REDACTED in page and "monday" in page


# --- permissions ---------------------------------------------------------------------------------


def test_each_schedule_action_needs_its_own_permission(login) -> None:
    assert choices(login(superuser=True, username="root")) == set(ACTIONS)


@pytest.mark.parametrize(("codename", "action"), [("pause_schedule", "pause_selected"),
                                                  ("resume_schedule", "resume_selected"),
                                                  ("run_schedule", "run_now_selected")])
def test_one_permission_opens_one_action(login, codename: str, action: str) -> None:
    assert choices(login("view_schedule", codename)) == {action}


@pytest.mark.parametrize("action", ACTIONS)
def test_view_only_staff_get_403_on_forged_posts_and_nothing_changes(login, action) -> None:
    active, paused = ScheduleFactory(), ScheduleFactory(paused_at=timezone.now())
    client = login("view_schedule")
    assert start(client, action, [active, paused]).status_code == 403
    assert confirm(client, action, [active, paused], reason="x").status_code == 403
    assert (fresh(active).state, fresh(paused).state) == ("active", "paused")
    assert Job.objects.count() == 0
    assert OperatorAction.objects.count() == 0


def test_view_only_staff_cannot_add_or_edit_schedules(login) -> None:
    schedule = ScheduleFactory(cron="0 3 * * *")
    client = login("view_schedule")
    assert client.post(f"{LIST}add/", form_data()).status_code == 403
    assert client.post(f"{LIST}{schedule.pk}/change/",
                       form_data(name=schedule.name, cron="0 4 * * *")).status_code == 403
    assert fresh(schedule).cron == "0 3 * * *"
    assert not Schedule.objects.filter(name="ops.nightly").exists()
    assert OperatorAction.objects.count() == 0


def test_titles_say_view_to_whoever_may_not_change(login) -> None:
    schedule, declared = ScheduleFactory(), ScheduleFactory(source=ScheduleSource.CODE)
    viewer = login("view_schedule", "pause_schedule", "run_schedule")
    assert viewer.get(LIST).context["title"] == "Select schedule to view"
    assert viewer.get(f"{LIST}{schedule.pk}/change/").context["title"] == "View schedule"
    editor = login("view_schedule", "change_schedule", username="editor")
    assert editor.get(LIST).context["title"] == "Select schedule to change"
    assert editor.get(f"{LIST}{schedule.pk}/change/").context["title"] == "Change schedule"
    assert editor.get(f"{LIST}{declared.pk}/change/").context["title"] == "View schedule"


USERS = {"viewer": ("view_schedule",), "editor": ("view_schedule", "change_schedule"),
         "root": ()}


@pytest.mark.parametrize(("user", "answers"), [
    ("viewer", {"list": 200, "failing": 200, "page": 200, "add": 403, "edit": 403}),
    ("editor", {"list": 200, "failing": 200, "page": 200, "add": 403, "edit": 302}),
    ("root", {"list": 200, "failing": 200, "page": 200, "add": 200, "edit": 302}),
])
def test_each_page_answers_each_user_as_their_permissions_say(login, user, answers) -> None:
    schedule = ScheduleFactory(name="ops.nightly", task="tests.admin.report",
                               last_error="boom", last_error_at=timezone.now())
    client = login(*USERS[user], superuser=user == "root", username=user)
    page = f"{LIST}{schedule.pk}/change/"
    assert {
        "list": client.get(LIST).status_code,
        "failing": client.get(LIST, {"state": "failing"}).status_code,
        "page": client.get(page).status_code,
        "add": client.get(f"{LIST}add/").status_code,
        "edit": client.post(page, form_data(cron="0 5 * * *")).status_code,
    } == answers


def test_nobody_deletes_a_schedule_and_declared_ones_are_read_only(login) -> None:
    declared = ScheduleFactory(source=ScheduleSource.CODE, cron="0 3 * * *")
    client = login(superuser=True)
    assert client.post(f"{LIST}{declared.pk}/delete/", {"post": "yes"}).status_code == 403
    assert client.post(f"{LIST}{declared.pk}/change/",
                       form_data(name=declared.name, cron="0 4 * * *")).status_code == 403
    assert fresh(declared).cron == "0 3 * * *"
    assert "delete_selected" not in choices(client)


# --- actions -----------------------------------------------------------------------------------


def test_pause_asks_first_then_pauses_the_active_ones_and_audits_it(login) -> None:
    active, paused = ScheduleFactory(), ScheduleFactory(paused_at=timezone.now())
    client = login("view_schedule", "pause_schedule", username="alice")
    plan = start(client, "pause_selected", [active, paused]).context["plan"]
    assert plan.changes[0].startswith("1 schedule (active) will stop ticking now.")
    assert plan.unchanged == ["1 schedule (1 paused) is not active and will not change."]
    assert fresh(active).state == "active" and OperatorAction.objects.count() == 0
    assert confirm(client, "pause_selected", [active, paused],
                   reason="provider outage").status_code == 302
    assert fresh(active).state == "paused"
    audit = OperatorAction.objects.get()
    assert (audit.action, audit.actor_name, audit.reason, audit.schedule_ids, audit.changed) == (
        "schedule_pause", "alice", "provider outage", sorted([active.pk, paused.pk]), 1)
    messages = [str(m) for m in client.get(LIST).context["messages"]]
    assert messages == ["Paused 1 schedule."]


def test_resume_ticks_again_from_the_next_tick_and_audits_it(login) -> None:
    paused = ScheduleFactory(paused_at=timezone.now() - timedelta(hours=1),
                             next_tick_at=timezone.now() - timedelta(hours=1))
    client = login("view_schedule", "resume_schedule")
    assert confirm(client, "resume_selected", [paused], reason="").status_code == 302
    paused = fresh(paused)
    assert paused.state == "active"
    assert paused.next_tick_at > timezone.now() - timedelta(seconds=2)
    assert OperatorAction.objects.get().action == "schedule_resume"


def test_run_now_enqueues_a_job_of_the_schedule_and_audits_it(login) -> None:
    schedule = ScheduleFactory(task="tests.admin.report", payload={"day": "friday"})
    client = login("view_schedule", "run_schedule", username="bob")
    plan = start(client, "run_now_selected", [schedule]).context["plan"]
    assert plan.changes[0].startswith("1 schedule will each get one job now")
    assert confirm(client, "run_now_selected", [schedule], reason="missed report").status_code \
        == 302
    ran = Job.objects.get(schedule=schedule)
    assert (ran.task, ran.payload) == ("tests.admin.report", {"day": "friday"})
    audit = OperatorAction.objects.get()
    assert (audit.action, audit.job_ids, audit.schedule_ids, audit.reason) == (
        "schedule_run_now", [ran.pk], [schedule.pk], "missed report")
    assert fresh(schedule).last_job_id == ran.pk


# --- creating and editing ----------------------------------------------------------------------


def test_an_operator_creates_a_schedule_for_a_registered_handler_and_it_is_audited(
    login,
) -> None:
    client = login("view_schedule", "add_schedule", username="carol")
    response = client.post(f"{LIST}add/", form_data())
    assert response.status_code == 302, response.context["adminform"].form.errors
    made = Schedule.objects.get(name="ops.nightly")
    assert (made.source, made.task, made.cron, made.timezone, made.payload) == (
        ScheduleSource.ADMIN, "tests.admin.report", "0 3 * * *", "Europe/Paris",
        {"recipient": "ops@example.com"})
    assert made.next_tick_at is not None and made.next_tick_at > timezone.now()
    audit = OperatorAction.objects.get()
    assert (audit.action, audit.actor_name, audit.schedule_ids) == (
        "schedule_create", "carol", [made.pk])
    assert audit.detail["definition"]["payload"] == {"recipient": REDACTED}


@pytest.mark.parametrize(("overrides", "message"), [
    ({"cron": "61 3 * * *"}, "schedule &#x27;ops.nightly&#x27;: cron is not a cron expression"),
    ({"timezone": "Europe/Atlantis"},
     "schedule &#x27;ops.nightly&#x27;: timezone is not a known time zone"),
    ({"task": "tests.not_registered"}, "Select a valid choice. tests.not_registered is not one"),
    ({"misfire": "later"}, "Select a valid choice. later is not one of the available choices."),
    ({"overlap": "queue"}, "Select a valid choice. queue is not one of the available choices."),
    ({"queue": "no spaces"}, "schedule &#x27;ops.nightly&#x27;: queue must be a queue name"),
    ({"catch_up_limit": "0"}, "schedule &#x27;ops.nightly&#x27;: catch_up_limit must be a whole "
                              "number from 1 to 10000, got 0"),
])
def test_bad_input_is_refused_at_save_naming_the_schedule(login, overrides, message) -> None:
    client = login("view_schedule", "add_schedule")
    response = client.post(f"{LIST}add/", form_data(**overrides))
    assert response.status_code == 200
    assert message in response.content.decode()
    assert not Schedule.objects.filter(name="ops.nightly").exists()
    assert OperatorAction.objects.count() == 0


@pytest.mark.parametrize(("payload", "error"), [
    ('{"a": "b\\u0000"}',
     "not JSON at payload['a']: contains a NUL character, which PostgreSQL cannot store"),
    ('{"a": "\\ud800"}', "not JSON at payload['a']: contains a lone surrogate ('\\ud800' at "
                          "index 0), which is not UTF-8"),
    ('{"a": [-' + "1" * 5001 + "]}", "not JSON at payload['a'][0]: an integer beyond ±2**1024 "
                                     "has no JSON reader outside Python; send it as a string"),
    ("[" * 40 + "]" * 40, "not JSON at payload" + "[0]" * 32 + ": nested more than 32 levels "
                          "deep (PGJOBS_MAX_PAYLOAD_DEPTH)"),
    ("[" * 100_000 + "]" * 100_000,
     "not JSON at payload: nested more than 32 levels deep (PGJOBS_MAX_PAYLOAD_DEPTH)"),
    ('{"text": "' + "x" * 70_000 + '"}', "payload is 70011 bytes encoded, over the 65536-byte "
                                        "limit (PGJOBS_MAX_PAYLOAD_BYTES)"),
])
def test_a_payload_enqueue_would_refuse_is_the_payload_fields_error(
    login, payload, error,
) -> None:
    client = login("view_schedule", "add_schedule")
    response = client.post(f"{LIST}add/", form_data(payload=payload))
    assert response.status_code == 200
    assert response.context["adminform"].form.errors["payload"][0].startswith(error)
    assert payload[:50].replace('"', "&quot;") in response.content.decode()  # shown as typed
    assert not Schedule.objects.exists()
    assert OperatorAction.objects.count() == 0


def test_an_edit_with_a_payload_enqueue_would_refuse_writes_nothing(login) -> None:
    schedule = ScheduleFactory(name="ops.nightly", task="tests.admin.report", cron="0 3 * * *",
                               payload={"recipient": "a@example.com"})
    client = login("view_schedule", "change_schedule", "view_raw_payload")
    response = client.post(f"{LIST}{schedule.pk}/change/",
                           form_data(payload='{"recipient": "\\udfff"}', cron="0 5 * * *"))
    assert response.status_code == 200
    assert "lone surrogate" in response.context["adminform"].form.errors["payload"][0]
    schedule = fresh(schedule)
    assert (schedule.cron, schedule.payload) == ("0 3 * * *", {"recipient": "a@example.com"})
    assert OperatorAction.objects.count() == 0


def test_an_edit_is_audited_with_what_changed_and_a_new_cron_moves_the_next_tick(login) -> None:
    schedule = ScheduleFactory(name="ops.nightly", task="tests.admin.report", cron="0 3 * * *",
                               timezone="Europe/Paris", payload={"recipient": "a@example.com"},
                               next_tick_at=datetime(2026, 1, 1, tzinfo=UTC))
    client = login("view_schedule", "change_schedule", "view_raw_payload", username="dan")
    response = client.post(f"{LIST}{schedule.pk}/change/",
                           form_data(cron="30 4 * * *",
                                     payload='{"recipient": "b@example.com"}'))
    assert response.status_code == 302
    schedule = fresh(schedule)
    assert (schedule.cron, schedule.payload) == ("30 4 * * *", {"recipient": "b@example.com"})
    assert schedule.next_tick_at > timezone.now()
    audit = OperatorAction.objects.get()
    assert (audit.action, audit.actor_name) == ("schedule_change", "dan")
    assert audit.detail == {"changed": {"cron": ["0 3 * * *", "30 4 * * *"],
                                        "payload": [{"recipient": REDACTED},
                                                    {"recipient": REDACTED}]}}


def test_an_editor_without_the_raw_payload_permission_cannot_see_or_change_the_payload(
    login,
) -> None:
    schedule = ScheduleFactory(name="ops.nightly", task="tests.admin.report", cron="0 3 * * *",
                               timezone="Europe/Paris", payload={"recipient": "a@example.com"})
    client = login("view_schedule", "change_schedule")
    page = client.get(f"{LIST}{schedule.pk}/change/").content.decode()
    assert "a@example.com" not in page
    response = client.post(f"{LIST}{schedule.pk}/change/",
                           form_data(cron="0 5 * * *", payload='{"recipient": "evil@x.org"}'))
    assert response.status_code == 302
    schedule = fresh(schedule)
    assert (schedule.cron, schedule.payload) == ("0 5 * * *", {"recipient": "a@example.com"})


def test_the_dashboard_shows_late_schedules(login, settings) -> None:
    settings.PGJOBS_SCHEDULE_GRACE_SECONDS = 60
    ScheduleFactory(name="ops.late", next_tick_at=timezone.now() - timedelta(minutes=10))
    ScheduleFactory(name="ops.fine", next_tick_at=timezone.now() + timedelta(minutes=10))
    client = login("view_job")
    page = client.get("/admin/pgjobs/job/dashboard/").content.decode()
    assert "1 late: the last due tick was not enqueued within 60s." in page
    assert "ops.late" in page and "ops.fine" not in page
    assert "not enqueued yet" in page

def test_an_editor_who_may_not_see_raw_payloads_cannot_change_the_task_that_hides_them(
    login,
) -> None:
    secret = {"customer": {"email": "ceo@example.com"}}
    schedule = ScheduleFactory(name="ops.nightly", task="tests.admin.receipt", payload=secret)
    client = login("view_schedule", "change_schedule", "run_schedule")
    page = f"{LIST}{schedule.pk}/change/"
    assert "task" not in client.get(page).context["adminform"].form.fields
    # A forged POST naming a task that hides nothing changes what the editor may change.
    assert client.post(page, form_data(task="tests.admin.digest", cron="0 5 * * *")).status_code \
        == 302
    assert (fresh(schedule).task, fresh(schedule).cron) == ("tests.admin.receipt", "0 5 * * *")
    assert "ceo@example.com" not in client.get(page).content.decode()
    assert confirm(client, "run_now_selected", [schedule], reason="").status_code == 302
    assert Job.objects.get(schedule=schedule).task == "tests.admin.receipt"


@pytest.mark.parametrize(("codenames", "payload"), [
    (("view_schedule", "change_schedule", "view_raw_payload"),
     {"customer": {"email": "ceo@example.com"}}),
    (("view_schedule", "change_schedule"), {"customer": {"name": "Ada"}}),
])
def test_the_task_stays_editable_to_who_sees_the_payload_or_when_it_hides_nothing(
    login, codenames, payload,
) -> None:
    schedule = ScheduleFactory(name="ops.nightly", task="tests.admin.receipt", payload=payload)
    client = login(*codenames)
    response = client.post(f"{LIST}{schedule.pk}/change/",
                           form_data(task="tests.admin.digest", payload=json.dumps(payload)))
    assert response.status_code == 302
    assert fresh(schedule).task == "tests.admin.digest"
