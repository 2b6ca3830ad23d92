"""Ticks as pure functions of now: misfire policies, batches, DST days, declarations.

No database: every function takes the instant it calls now, so a whole DST day is walked in a
loop of passes, the way workers would walk it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise, takewhile
from zoneinfo import ZoneInfo

import pytest

import django_pgjobs
from django_pgjobs import InvalidJobOption, Schedule
from django_pgjobs.registry import registry
from django_pgjobs.ticks import COUNT_MAX, next_ticks, plan_ticks, ticks_after

PARIS = ZoneInfo("Europe/Paris")
SPRING = datetime(2026, 3, 29, tzinfo=PARIS)  # 02:00 CET -> 03:00 CEST
AUTUMN = datetime(2026, 10, 25, tzinfo=PARIS)  # 03:00 CEST -> 02:00 CET
EVERY_SECOND = "* * * * * *"


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def plan(cron: str = EVERY_SECOND, zone: str = "UTC", **kwargs):
    options = {"grace_seconds": 3.0, "misfire": "skip", "catch_up_limit": 3, "limit": 100}
    return plan_ticks(cron, zone, **{**options, **kwargs})


def seconds(ticks) -> list[int]:
    return [t.second for t in ticks]


def walk(cron: str, zone: str, start: datetime, end: datetime, *, step: timedelta,
         grace: float = 60.0, misfire: str = "skip") -> list[datetime]:
    """Every tick enqueued by passes every ``step`` from ``start`` to ``end``, as workers do."""
    start, end = start.astimezone(UTC), end.astimezone(UTC)  # real instants, not wall clocks
    cursor = next(ticks_after(cron, zone, start))
    now, runs = start, []
    while now <= end:
        result = plan_ticks(cron, zone, cursor=cursor, now=now, grace_seconds=grace,
                            misfire=misfire, catch_up_limit=10, limit=100)
        runs += result.run
        assert result.cursor is not None and result.cursor > now
        cursor = result.cursor
        now += step
    return runs


def local(ticks) -> list[str]:
    return [t.astimezone(PARIS).strftime("%H:%M%z") for t in ticks]


# --- misfire policies -------------------------------------------------------------------------

# The cursor is at :50, now is 12:00:00.5 with 3 s of grace: the ticks :50 to :57 were missed,
# :58, :59 and :00 are on time.
NOW = utc(2026, 1, 10, 12, 0, 0) + timedelta(milliseconds=500)
CURSOR = utc(2026, 1, 10, 11, 59, 50)


def test_skip_runs_only_the_latest_missed_tick_and_every_tick_on_time() -> None:
    result = plan(cursor=CURSOR, now=NOW, misfire="skip")
    assert seconds(result.run) == [57, 58, 59, 0]
    assert result.missed == 7  # :50 to :56
    assert result.passed_over == utc(2026, 1, 10, 11, 59, 56)
    assert (result.cursor, result.last_handled) == (utc(2026, 1, 10, 12, 0, 1), NOW.replace(
        microsecond=0))


def test_catch_up_runs_the_latest_missed_ticks_up_to_its_limit() -> None:
    result = plan(cursor=CURSOR, now=NOW, misfire="catch_up", catch_up_limit=3)
    assert seconds(result.run) == [55, 56, 57, 58, 59, 0]
    assert result.missed == 5
    everything = plan(cursor=CURSOR, now=NOW, misfire="catch_up", catch_up_limit=100)
    assert seconds(everything.run) == [50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 0]
    assert everything.missed == 0


def test_none_runs_no_missed_tick() -> None:
    result = plan(cursor=CURSOR, now=NOW, misfire="none")
    assert seconds(result.run) == [58, 59, 0]
    assert (result.missed, result.passed_over) == (8, utc(2026, 1, 10, 11, 59, 57))


def test_nothing_is_due_before_the_cursor() -> None:
    result = plan(cursor=utc(2026, 1, 10, 12, 0, 1), now=NOW)
    assert (result.run, result.missed, result.cursor, result.last_handled) == (
        (), 0, utc(2026, 1, 10, 12, 0, 1), None)


def test_a_batch_limit_stops_after_the_last_tick_run_and_the_next_pass_goes_on() -> None:
    first = plan(cursor=CURSOR, now=NOW, misfire="catch_up", catch_up_limit=5, limit=4)
    assert seconds(first.run) == [53, 54, 55, 56]
    assert (first.missed, first.cursor) == (3, utc(2026, 1, 10, 11, 59, 57))
    second = plan(cursor=first.cursor, now=NOW, misfire="catch_up", catch_up_limit=5, limit=4)
    assert seconds(second.run) == [57, 58, 59, 0]
    assert (second.missed, second.cursor) == (0, utc(2026, 1, 10, 12, 0, 1))


def test_a_long_outage_is_handled_in_bounded_work_and_counts_at_most_the_cap() -> None:
    # A per-second schedule down for ten days: about 864,000 missed ticks.
    result = plan(cursor=utc(2026, 1, 1), now=NOW, misfire="catch_up", catch_up_limit=5)
    assert seconds(result.run) == [53, 54, 55, 56, 57, 58, 59, 0]
    assert result.missed == COUNT_MAX
    skip = plan(cursor=utc(2026, 1, 1), now=NOW, misfire="skip")
    assert seconds(skip.run) == [57, 58, 59, 0]


@pytest.mark.parametrize(("cron", "cursor", "missed_ticks"), [
    ("0 0 1 1 *", utc(2025, 1, 1), [utc(2025, 1, 1), utc(2026, 1, 1)]),
    ("0 0 29 2 *", utc(2020, 2, 29), [utc(2020, 2, 29), utc(2024, 2, 29)]),
])
@pytest.mark.parametrize("limit", [500, 2_025, 10_000])
def test_a_rare_tick_caught_up_with_a_big_limit_walks_back_no_further_than_the_cursor(
    cron: str, cursor: datetime, missed_ticks: list[datetime], limit: int
) -> None:
    # Walking back `limit` ticks of a yearly expression would pass year 1.
    result = plan(cron, cursor=cursor, now=NOW, misfire="catch_up", catch_up_limit=limit)
    assert (list(result.run), result.missed) == (missed_ticks, 0)
    assert result.cursor == next(ticks_after(cron, "UTC", NOW))


def test_seconds_level_expressions_tick_on_their_seconds() -> None:
    ticks = next_ticks("*/15 * * * * *", "UTC", utc(2026, 1, 1, 0, 0, 7), 5)
    assert [(t.minute, t.second) for t in ticks] == [(0, 15), (0, 30), (0, 45), (1, 0), (1, 15)]


# --- DST ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("step", [timedelta(seconds=30), timedelta(minutes=7)])
def test_spring_forward_an_hourly_schedule_runs_once_per_real_hour(step: timedelta) -> None:
    runs = walk("0 * * * *", "Europe/Paris", SPRING - timedelta(minutes=30),
                SPRING + timedelta(hours=23, minutes=30), step=step)
    assert len(runs) == len(set(runs)) == 23  # 02:00 does not exist that day
    assert local(runs[:4]) == ["00:00+0100", "01:00+0100", "03:00+0200", "04:00+0200"]
    assert all(b - a == timedelta(hours=1) for a, b in pairwise(runs))


@pytest.mark.parametrize("cron", ["30 2 * * *", "0 2 * * *", "59 2 * * *"])
def test_spring_forward_a_daily_run_in_the_skipped_hour_runs_right_after_the_gap(
    cron: str,
) -> None:
    runs = walk(cron, "Europe/Paris", SPRING - timedelta(hours=1), SPRING + timedelta(hours=23),
                step=timedelta(seconds=45))
    assert local(runs) == ["03:00+0200"]
    assert runs == [utc(2026, 3, 29, 1, 0)]


def test_fall_back_an_hourly_schedule_runs_at_both_real_two_oclocks_and_no_more() -> None:
    runs = walk("0 * * * *", "Europe/Paris", AUTUMN - timedelta(minutes=30),
                AUTUMN + timedelta(hours=23, minutes=30), step=timedelta(seconds=40))
    assert len(runs) == len(set(runs)) == 25  # a 25-hour day: one run per real hour
    assert local(runs[:5]) == ["00:00+0200", "01:00+0200", "02:00+0200", "02:00+0100",
                               "03:00+0100"]
    assert all(b - a == timedelta(hours=1) for a, b in pairwise(runs))


@pytest.mark.parametrize(("cron", "at"), [("30 2 * * *", utc(2026, 10, 25, 0, 30)),
                                          ("0 2 * * *", utc(2026, 10, 25, 0, 0)),
                                          ("15 2,3 * * *", utc(2026, 10, 25, 0, 15))])
def test_fall_back_a_daily_run_in_the_repeated_hour_runs_once(cron: str, at: datetime) -> None:
    runs = walk(cron, "Europe/Paris", AUTUMN - timedelta(hours=1),
                AUTUMN + timedelta(hours=24), step=timedelta(seconds=20))
    assert runs[0] == at
    once = [t for t in runs if t.astimezone(PARIS).hour == 2]
    assert once == [at]  # not again an hour later, at the second 02:xx


@pytest.mark.slow
def test_a_walk_started_anywhere_in_a_dst_day_yields_the_same_ticks() -> None:
    # Workers restart, and cursors are recomputed from now: whatever instant a walk starts at,
    # it must go on exactly as the walk started the day before.
    for day in (SPRING, AUTUMN):
        begin = (day - timedelta(hours=3)).astimezone(UTC)
        end = (day + timedelta(hours=27)).astimezone(UTC)
        for cron in ("30 2 * * *", "0 * * * *", "*/20 * * * *", "0 1-3 * * *", "0 */2 * * *"):
            def before_end(tick: datetime, end: datetime = end) -> bool:
                return tick < end

            full = list(takewhile(before_end, ticks_after(cron, "Europe/Paris", begin)))
            start = begin
            while start < end - timedelta(hours=2):
                got = list(takewhile(before_end, ticks_after(cron, "Europe/Paris", start)))
                assert got == [t for t in full if t > start], (cron, start)
                start += timedelta(minutes=3, seconds=17)
                # The same instant given in the zone, inside a repeated hour, walks the same.
                in_zone = list(takewhile(before_end, ticks_after(
                    cron, "Europe/Paris", start.astimezone(PARIS))))
                assert in_zone == [t for t in full if t > start], (cron, start)


def test_an_outage_across_the_repeated_hour_catches_up_each_real_tick_once() -> None:
    result = plan_ticks(
        "30 * * * *", "Europe/Paris", cursor=utc(2026, 10, 24, 23, 30),
        now=utc(2026, 10, 25, 4, 0), grace_seconds=60, misfire="catch_up", catch_up_limit=10,
        limit=100,
    )
    assert local(result.run) == ["01:30+0200", "02:30+0200", "02:30+0100", "03:30+0100",
                                 "04:30+0100"]
    assert result.missed == 0


def test_next_ticks_follow_the_zone_not_utc() -> None:
    ticks = next_ticks("0 6 * * *", "Europe/Paris", utc(2026, 3, 27, 12), 3)
    assert local(ticks) == ["06:00+0100", "06:00+0200", "06:00+0200"]
    assert [t.hour for t in ticks] == [5, 4, 4]  # in UTC


# --- declarations ------------------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"cron": "61 * * * *", "name": "bad.cron"},
     "schedule 'bad.cron': cron is not a cron expression (Bad minute)"),
    ({"cron": "* * *", "name": "short"}, "schedule 'short': cron is not a cron expression"),
    ({"cron": "@daily", "name": "alias"}, "schedule 'alias': cron is not a cron expression"),
    ({"cron": "0 6 * * *", "name": "tz", "timezone": "Europe/Atlantis"},
     "schedule 'tz': timezone is not a known time zone"),
    ({"cron": "0 6 * * *", "name": "tz2", "timezone": ""},
     "schedule 'tz2': timezone must be a time zone name"),
    ({"cron": "0 6 * * *", "name": "m", "misfire": "later"},
     "schedule 'm': misfire must be one of 'skip', 'catch_up', 'none', got 'later'"),
    ({"cron": "0 6 * * *", "name": "o", "overlap": "queue"},
     "schedule 'o': overlap must be one of 'allow', 'skip', got 'queue'"),
    ({"cron": "0 6 * * *", "name": "c", "catch_up_limit": 0},
     "schedule 'c': catch_up_limit must be a whole number from 1 to 10000, got 0"),
    ({"cron": "0 6 * * *", "name": "p", "payload": {"when": datetime(2026, 1, 1)}},
     "schedule 'p': payload is refused: not JSON at payload['when']: datetime is not JSON"),
    ({"cron": "0 6 * * *", "name": "q", "queue": "a b"}, "schedule 'q': queue must be a queue"),
    ({"cron": "0 6 * * *", "name": "pr", "priority": 101},
     "schedule 'pr': priority must be a whole number from -100 to 100, got 101"),
    ({"cron": "0 6 * * *", "name": "bad name"}, "name must be a schedule name"),
    ({"cron": "61 * * * *"}, "the schedule with cron '61 * * * *': cron is not a cron"),
])
def test_bad_declarations_are_refused_naming_the_schedule(kwargs, message) -> None:
    with pytest.raises(InvalidJobOption) as refused:
        Schedule(**kwargs)
    assert message in str(refused.value)


def test_a_payload_too_large_is_refused_at_declaration(settings) -> None:
    settings.PGJOBS_MAX_PAYLOAD_BYTES = 100
    with pytest.raises(InvalidJobOption, match="schedule 'big': payload is refused: payload is "
                                               "1008 bytes encoded, over the 100-byte limit"):
        Schedule("0 6 * * *", name="big", payload={"x": "y" * 1000})


def test_a_queue_outside_pgjobs_queues_is_refused(settings) -> None:
    settings.PGJOBS_QUEUES = ["default"]
    with pytest.raises(InvalidJobOption, match="schedule 'q': queue is not in PGJOBS_QUEUES"):
        Schedule("0 6 * * *", name="q", queue="reports")


def test_job_declares_schedules_named_after_the_task_or_by_their_own_names() -> None:
    try:
        handler = django_pgjobs.job(
            "tests.ticks.daily", cron="0 6 * * *", timezone="Europe/Paris",
            schedules=[Schedule("0 18 * * 1-5", name="tests.ticks.evening",
                                payload={"part": "evening"})],
        )(lambda ctx, payload: None)
        assert [(s.name, s.task, s.cron, s.timezone, s.payload) for s in handler.schedules] == [
            ("tests.ticks.daily", "tests.ticks.daily", "0 6 * * *", "Europe/Paris", {}),
            ("tests.ticks.evening", "tests.ticks.daily", "0 18 * * 1-5", "UTC",
             {"part": "evening"}),
        ]
        assert {"tests.ticks.daily", "tests.ticks.evening"} <= {
            s.name for s in registry.schedules()}
    finally:
        registry.remove("tests.ticks.daily")


@pytest.mark.parametrize(("options", "message"), [
    ({"cron": "0 6 * * *", "timezone": "Mars/Base"},
     "task 'tests.ticks.bad': schedule 'tests.ticks.bad': timezone is not a known"),
    ({"cron": "bad"}, "cron is not a cron expression"),
    ({"timezone": "UTC"}, "timezone= goes with cron="),
    ({"schedules": Schedule("0 6 * * *")}, "schedules must be a list of Schedule"),
    ({"schedules": ["0 6 * * *"]}, "schedules must be a list of Schedule(...), got str"),
    ({"schedules": [Schedule("0 6 * * *"), Schedule("0 7 * * *")]},
     "declares two schedules named 'tests.ticks.bad'"),
])
def test_bad_schedules_on_job_are_refused_at_declaration(options, message) -> None:
    with pytest.raises(InvalidJobOption) as refused:
        django_pgjobs.job("tests.ticks.bad", **options)(lambda ctx, payload: None)
    assert message in str(refused.value)
    assert registry.get("tests.ticks.bad") is None


def test_two_handlers_cannot_declare_the_same_schedule_name() -> None:
    django_pgjobs.job("tests.ticks.one", cron="0 6 * * *")(lambda ctx, payload: None)
    try:
        with pytest.raises(InvalidJobOption, match=r"schedule 'tests\.ticks\.one' of task "
                                                   r"'tests\.ticks\.two' is already declared "
                                                   r"by task 'tests\.ticks\.one'"):
            django_pgjobs.job("tests.ticks.two", schedules=[
                Schedule("0 7 * * *", name="tests.ticks.one")])(lambda ctx, payload: None)
    finally:
        registry.remove("tests.ticks.one")
