"""When a schedule's ticks fall, and which of them run.

``Schedule`` declares one schedule (a cron expression in a time zone, a payload, the misfire and
overlap policies). The rest are pure functions of an expression, a zone and the time *now*,
which callers pass in: the database's clock in production, any instant in a test, so DST days
are tested without a database or a frozen clock.

Ticks are computed by cronsim in the schedule's zone and handed out as aware UTC datetimes: a
tick is an instant, and that instant is what the job table's unique index on (schedule, tick)
compares. In the zone's repeated hour (autumn) a fixed-time schedule fires once, at the first
occurrence; in its skipped hour (spring) a fixed-time tick moves to the first instant after the
gap; schedules of hourly or finer granularity fire at every real instant that matches (Debian
cron's rules, which cronsim implements). ``ticks_after`` also drops the rare tick cronsim
returns at or before its start inside a repeated hour, so a walk started anywhere yields the
same ticks as a walk started long before.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from functools import cache
from itertools import islice
from typing import Any
from zoneinfo import ZoneInfo

from cronsim import CronSim

from .conf import settings
from .exceptions import InvalidJobOption, PgJobsError
from .payloads import encode_json
from .status import MisfirePolicy, OverlapPolicy
from .validation import (
    PRIORITY_MAX,
    PRIORITY_MIN,
    choice_problem,
    cron_problem,
    queue_problem,
    schedule_name_problem,
    shown,
    task_name_problem,
    timezone_problem,
    whole_number_problem,
)

DEFAULT_CATCH_UP_LIMIT = 100
CATCH_UP_LIMIT_MAX = 10_000
# Missed ticks are counted one by one up to this many per pass; past it the count is a lower
# bound. Counting 10,000 takes a few milliseconds; nobody needs the exact figure of an outage
# that missed more.
COUNT_MAX = 10_000
# Reverse iteration only finds where to start walking forward; this margin covers the hour a
# DST change repeats, where the two directions of cronsim can disagree.
_REVERSE_MARGIN = timedelta(hours=3)
_ONE_MICROSECOND = timedelta(microseconds=1)

# How many of the latest missed ticks each misfire policy runs, given the catch-up limit.
MISFIRE_KEEPS: dict[str, Callable[[int], int]] = {
    MisfirePolicy.SKIP: lambda limit: 1,
    MisfirePolicy.CATCH_UP: lambda limit: limit,
    MisfirePolicy.NONE: lambda limit: 0,
}


@cache
def zone(name: str) -> ZoneInfo:
    """The time zone called ``name`` (checked by ``validation.timezone_problem``)."""
    return ZoneInfo(name)


def ticks_after(cron: str, zone_name: str, after: datetime) -> Iterator[datetime]:
    """The ticks strictly after ``after``, oldest first, as UTC datetimes.

    Ends when the expression fires no more (cronsim looks 50 years ahead).
    """
    # Compared in UTC: two datetimes of the same zone compare by wall clock, which puts a tick
    # of the first 02:30 after a start at the second 02:15 of a repeated hour.
    after = after.astimezone(UTC)
    for tick in CronSim(cron, after.astimezone(zone(zone_name))):
        instant = tick.astimezone(UTC)
        if instant > after:
            yield instant


def ticks_from(cron: str, zone_name: str, start: datetime) -> Iterator[datetime]:
    """The ticks at or after ``start``, oldest first."""
    return ticks_after(cron, zone_name, start - _ONE_MICROSECOND)


def next_ticks(cron: str, zone_name: str, after: datetime, count: int) -> list[datetime]:
    """The next ``count`` ticks strictly after ``after`` (fewer if the expression stops)."""
    return list(islice(ticks_after(cron, zone_name, after), count))


def next_tick(cron: str, zone_name: str, after: datetime) -> datetime | None:
    """The first tick strictly after ``after``; None when the expression never fires again."""
    return next(ticks_after(cron, zone_name, after), None)


@dataclass(frozen=True)
class TickPlan:
    """What one pass does with a schedule's due ticks.

    ``run`` are the ticks to enqueue, oldest first; ``missed`` how many due ticks the misfire
    policy passed over (a lower bound past ``COUNT_MAX``); ``cursor`` the first tick not yet
    handled (None: the expression never fires again); ``last_handled`` the latest tick run or
    passed over (None when nothing was due); ``passed_over`` the latest of the missed ticks
    that do not run (None if there is none, or, far behind, when the walk started past it).
    """

    run: tuple[datetime, ...]
    missed: int
    cursor: datetime | None
    last_handled: datetime | None
    passed_over: datetime | None = None


def plan_ticks(
    cron: str,
    zone_name: str,
    *,
    cursor: datetime | None,
    now: datetime,
    grace_seconds: float,
    misfire: str,
    catch_up_limit: int,
    limit: int,
) -> TickPlan:
    """Which of the ticks from ``cursor`` up to ``now`` run, at most ``limit`` of them.

    A tick within ``grace_seconds`` of ``now`` is on time and runs. An older one was missed (no
    worker enqueued it in time): the misfire policy keeps the latest 1 (skip), the latest
    ``catch_up_limit`` (catch_up) or none of them, and passes over the rest. When ``limit`` cuts
    the run short, the cursor stops after the last tick run and the next pass goes on from there.
    """
    if cursor is None or cursor > now:
        return TickPlan((), 0, cursor, None)
    cursor, now = cursor.astimezone(UTC), now.astimezone(UTC)
    if limit < 1:
        raise ValueError("limit must be at least 1")
    boundary = now - timedelta(seconds=grace_seconds)
    kept: list[datetime] = []
    missed = 0
    latest_missed = passed_over = None
    start = cursor
    if cursor < boundary:
        keep = MISFIRE_KEEPS[misfire](catch_up_limit)
        kept, missed, latest_missed, passed_over = _missed_ticks(
            cron, zone_name, cursor, boundary, keep)
        start = boundary
    room = max(limit - len(kept), 0) + 1
    on_time = [t for t in islice(ticks_from(cron, zone_name, start), room) if t <= now]
    run = kept + on_time
    if len(run) > limit:
        run = run[:limit]
        return TickPlan(tuple(run), missed, next_tick(cron, zone_name, run[-1]), run[-1],
                        passed_over)
    handled = [t for t in (latest_missed, run[-1] if run else None) if t is not None]
    return TickPlan(tuple(run), missed, next_tick(cron, zone_name, now),
                    max(handled) if handled else None, passed_over)


def _missed_ticks(
    cron: str, zone_name: str, start: datetime, before: datetime, keep: int
) -> tuple[list[datetime], int, datetime | None, datetime | None]:
    """The latest ``keep`` ticks in [start, before); how many ticks there are passed over (the
    ones before them); the latest tick there; and the latest passed over."""
    walk_from = start
    skipped_ahead = 0
    # Far more missed ticks than kept (a per-second schedule down for days): start the walk
    # shortly before the kept ones instead of at the cursor, and count the rest up to the cap.
    # The reverse walk stops at the cursor: a yearly schedule that keeps 5,000 would otherwise
    # walk back past year 1.
    kth = next(islice(_ticks_before(cron, zone_name, before, start), keep, None), None)
    if kth is not None and kth - _REVERSE_MARGIN > start:
        walk_from = kth - _REVERSE_MARGIN
        skipped_ahead = _count(cron, zone_name, start, walk_from)
    last: deque[datetime] = deque(maxlen=keep + 1)
    walked = 0
    for tick in ticks_from(cron, zone_name, walk_from):
        if tick >= before:
            break
        last.append(tick)
        walked += 1
    latest = last[-1] if last else None
    kept = list(last)[-keep:] if keep else []
    passed_over = last[0] if len(last) > keep else None
    return kept, min(skipped_ahead + walked - len(kept), COUNT_MAX), latest, passed_over


def _ticks_before(
    cron: str, zone_name: str, before: datetime, start: datetime
) -> Iterator[datetime]:
    """The ticks in [start, before), latest first."""
    before = before.astimezone(UTC)
    for tick in CronSim(cron, before.astimezone(zone(zone_name)), reverse=True):
        instant = tick.astimezone(UTC)
        if instant < start:
            return
        if instant < before:
            yield instant


def due_count(
    cron: str, zone_name: str, start: datetime, now: datetime
) -> tuple[int, datetime | None]:
    """How many ticks fall in [start, now] (up to ``COUNT_MAX``), and the latest of them."""
    latest = next(_ticks_before(cron, zone_name, now + _ONE_MICROSECOND, start), None)
    if latest is None:
        return 0, None
    return _count(cron, zone_name, start, latest + _ONE_MICROSECOND), latest


def _count(cron: str, zone_name: str, start: datetime, before: datetime) -> int:
    """Ticks in [start, before), counted up to ``COUNT_MAX``."""
    counted = 0
    for tick in ticks_from(cron, zone_name, start):
        if tick >= before or counted >= COUNT_MAX:
            break
        counted += 1
    return counted


# --- declaring a schedule ------------------------------------------------------------------------


@dataclass(frozen=True)
class Schedule:
    """A periodic schedule: the handler's jobs enqueued at each tick of ``cron`` in ``timezone``.

    ``cron`` has 5 fields, or 6 with seconds first (``*/10 * * * * *``). ``payload`` is what
    each job gets; ``queue`` and ``priority`` default to the handler's. ``misfire`` says which
    missed ticks run (``skip``: the latest; ``catch_up``: up to ``catch_up_limit`` of the latest;
    ``none``), ``overlap`` whether a tick runs while the previous tick's job has not finished.
    ``name`` identifies it (default: the task name) and must be unique.
    """

    cron: str
    name: str | None = None
    payload: Any = field(default_factory=dict)
    timezone: str = "UTC"
    misfire: str = MisfirePolicy.SKIP
    catch_up_limit: int = DEFAULT_CATCH_UP_LIMIT
    overlap: str = OverlapPolicy.ALLOW
    queue: str | None = None
    priority: int | None = None
    task: str | None = None

    def __post_init__(self) -> None:
        problem = self.problem()
        if problem is not None:
            raise InvalidJobOption(problem)

    @property
    def label(self) -> str:
        """How errors name it: by name, or by its expression before it has one."""
        if self.name is not None:
            return f"schedule {shown(self.name, 80)}"
        return f"the schedule with cron {shown(self.cron, 80)}"

    def problem(self) -> str | None:
        """What is wrong with this declaration, naming it; None when nothing is."""
        for what, problem in self._problems():
            if problem is not None:
                return f"{self.label}: {what} {problem}"
        return None

    def _problems(self) -> Iterator[tuple[str, str | None]]:
        if self.name is not None:
            yield "name", schedule_name_problem(self.name)
        if self.task is not None:
            yield "task", task_name_problem(self.task)
        yield "cron", cron_problem(self.cron)
        yield "timezone", timezone_problem(self.timezone)
        yield "misfire", choice_problem(self.misfire, MisfirePolicy.values)
        yield "overlap", choice_problem(self.overlap, OverlapPolicy.values)
        yield "catch_up_limit", whole_number_problem(self.catch_up_limit, 1, CATCH_UP_LIMIT_MAX)
        if self.queue is not None:
            yield "queue", queue_problem(self.queue)
            queues = settings.QUEUES
            if queues is not None and self.queue not in queues:
                yield "queue", f"is not in PGJOBS_QUEUES, got {shown(self.queue)}"
        if self.priority is not None:
            yield "priority", whole_number_problem(self.priority, PRIORITY_MIN, PRIORITY_MAX)
        yield "payload", _payload_problem(self.payload)

    def bound(self, task: str) -> Schedule:
        """This schedule as declared on the handler of ``task`` (named after it by default)."""
        return replace(self, task=task, name=self.name if self.name is not None else task)

    def next_ticks(self, after: datetime, count: int) -> list[datetime]:
        return next_ticks(self.cron, self.timezone, after, count)


def _payload_problem(payload: Any) -> str | None:
    try:
        encode_json(payload, limit=settings.MAX_PAYLOAD_BYTES,
                    max_depth=settings.MAX_PAYLOAD_DEPTH)
    except PgJobsError as exc:
        return f"is refused: {exc}"
    return None


__all__ = [
    "CATCH_UP_LIMIT_MAX",
    "COUNT_MAX",
    "DEFAULT_CATCH_UP_LIMIT",
    "MISFIRE_KEEPS",
    "Schedule",
    "TickPlan",
    "due_count",
    "next_tick",
    "next_ticks",
    "plan_ticks",
    "ticks_after",
    "ticks_from",
    "zone",
]
