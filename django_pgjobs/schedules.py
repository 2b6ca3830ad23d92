"""Periodic schedules: the declared ones synced into the table, due ticks enqueued, and the
operators' changes to schedules.

``enqueue_due_ticks`` is the schedule step every worker runs. One pass locks a bounded batch of
due schedules (SKIP LOCKED), decides with ``ticks.plan_ticks`` which of their ticks run, enqueues
those jobs through ``enqueuing.enqueue_many`` (one statement, each job carrying its tick) and
moves each schedule's cursor, all in one transaction. Two guarantees hold it to one job per
tick: a schedule is in one worker's pass at a time (the lock), and the job table's unique index
on (schedule, tick) turns a second insert of the same tick into nothing (ON CONFLICT DO
NOTHING), whatever a cursor says. docs/schedules.md has the reasoning.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import islice
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.models import F

from . import models, sql
from .conf import settings
from .enqueuing import JobSpec, Tick, enqueue_many, validate
from .exceptions import EnqueueError, InvalidJobOption
from .models import Job, OperatorActionKind
from .redaction import Redactor
from .registry import redactor_for, registry
from .status import OverlapPolicy, ScheduleSource, SkipReason
from .ticks import Schedule, due_count, next_tick, next_ticks, plan_ticks, ticks_from
from .transitions import (
    CODE,
    Actor,
    audit_schedule_action,
    counts_by_state,
    database_now,
    unique_ids,
)
from .validation import escape_control, schedule_name_problem

logger = logging.getLogger("django_pgjobs.schedules")

# A schedule that cannot be enqueued (its payload or queue no longer passes), or whose ticks
# cannot be planned, is logged at most this often while it stays so; it shows as late meanwhile.
REFUSED_REMIND_SECONDS = 300.0
# How long one pass may hold its schedule rows: any statement after the one that locks them,
# and any wait between two of its statements. A worker stopped mid-pass loses its session after
# this, its pass rolls back, and the next live worker's pass (one interval later) takes the rows.
PASS_HOLD_SECONDS = 10
# A schedule's ``last_error`` is cut to this many characters.
LAST_ERROR_MAX_CHARS = 1000
SETTINGS_KEYS = frozenset({"task", "cron", "payload", "timezone", "misfire", "catch_up_limit",
                           "overlap", "queue", "priority"})
# The fields that define a schedule; an operator edits them on admin schedules only.
DEFINITION = ("task", "cron", "timezone", "payload", "queue", "priority", "misfire",
              "catch_up_limit", "overlap")


# --- what is declared --------------------------------------------------------------------------


@dataclass(frozen=True)
class Declared:
    schedule: Schedule
    source: ScheduleSource


def declared_schedules() -> tuple[list[Declared], list[str]]:
    """The schedules code and PGJOBS_SCHEDULES declare, and the problems of those refused.

    Every problem names its schedule: a settings entry that is not a schedule, a task no
    handler registers, a name declared twice, a job enqueue would refuse.
    """
    found = [Declared(s, ScheduleSource.CODE) for s in registry.schedules()]
    problems: list[str] = []
    configured = settings.SCHEDULES
    if not isinstance(configured, dict):
        return found, ["PGJOBS_SCHEDULES must be a dict of schedule name to options"]
    for name, entry in configured.items():
        try:
            found.append(Declared(settings_schedule(name, entry), ScheduleSource.SETTINGS))
        except InvalidJobOption as exc:
            problems.append(str(exc))
    seen: dict[str, Declared] = {}
    kept: list[Declared] = []
    for declared in found:
        schedule = declared.schedule
        name = str(schedule.name)
        if name in seen:
            problems.append(f"schedule {name!r} is declared twice (by {seen[name].source.label} "
                            f"and {declared.source.label}): schedule names are unique")
            continue
        seen[name] = declared
        problem = job_problem(schedule)
        if problem is not None:
            problems.append(problem)
            continue
        kept.append(declared)
    return kept, problems


def settings_schedule(name: Any, entry: Any) -> Schedule:
    """The schedule a PGJOBS_SCHEDULES entry declares; raise ``InvalidJobOption`` naming it."""
    problem = schedule_name_problem(name)
    if problem is not None:
        raise InvalidJobOption(f"PGJOBS_SCHEDULES: a key {problem}")
    where = f"PGJOBS_SCHEDULES[{name!r}]"
    if not isinstance(entry, dict):
        raise InvalidJobOption(f"{where} must be a dict of options, got {type(entry).__name__}")
    unknown = sorted(escape_control(str(k)) for k in entry if k not in SETTINGS_KEYS)
    if unknown:
        raise InvalidJobOption(f"{where}: unknown option(s) {', '.join(unknown)}")
    for required in ("task", "cron"):
        if required not in entry:
            raise InvalidJobOption(f"{where} needs {required!r}")
    try:
        return Schedule(name=name, **entry)
    except InvalidJobOption as exc:
        raise InvalidJobOption(f"{where}: {exc}") from None


def job_problem(schedule: Schedule) -> str | None:
    """Whether enqueue would take this schedule's jobs; the answer names the schedule."""
    handler = registry.get(str(schedule.task))
    if handler is None:
        return (f"{schedule.label}: task {schedule.task!r} has no registered handler "
                "(register it with @django_pgjobs.job)")
    try:
        validate(spec_for(schedule, None))
    except EnqueueError as exc:
        return f"{schedule.label}: its jobs would be refused: {exc}"
    return None


def spec_for(schedule: Schedule | models.Schedule | _Due, tick: Tick | None) -> JobSpec:
    """The job of one tick of ``schedule``: its payload, and its queue and priority if set."""
    options: dict[str, Any] = {}
    if schedule.queue:
        options["queue"] = schedule.queue
    if schedule.priority is not None:
        options["priority"] = schedule.priority
    return JobSpec(str(schedule.task), schedule.payload, options, tick=tick)


def declaration_of(row: models.Schedule) -> Schedule:
    """The declaration a schedule row holds (raise ``InvalidJobOption`` when it is not one)."""
    return Schedule(
        row.cron, name=row.name, payload=row.payload, timezone=row.timezone,
        misfire=row.misfire, catch_up_limit=row.catch_up_limit, overlap=row.overlap,
        queue=row.queue or None, priority=row.priority, task=row.task,
    )


def upcoming_ticks(row: models.Schedule, count: int, now: datetime) -> list[datetime]:
    """The next ``count`` ticks an operator should expect: from the cursor for an active
    schedule (a late one starts in the past), after ``now`` for a paused one (what a resume
    would run), none for a retired one."""
    if row.state == "retired":
        return []
    if row.state == "paused":
        return next_ticks(row.cron, row.timezone, now, count)
    if row.next_tick_at is None:
        return []
    return list(islice(ticks_from(row.cron, row.timezone, row.next_tick_at), count))


# --- the sync at worker start -----------------------------------------------------------------


@dataclass
class SyncReport:
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    retired: list[str] = field(default_factory=list)
    # Declared, but an operator's schedule already has the name: left as the operator made it.
    conflicts: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


def sync_declared(*, using: str = DEFAULT_DB_ALIAS) -> SyncReport:
    """Write the declared schedules into the table: add, change, retire; return what changed.

    Safe from many workers at once: each declared row is one upsert, and a row another sync
    writes at the same moment is waited for, not written twice. A retired schedule keeps its
    row and its jobs; declaring it again brings it back, with its next tick counted from now.
    """
    declared, problems = declared_schedules()
    report = SyncReport(refused=problems)
    for problem in problems:
        logger.error("schedule.refused %s", escape_control(problem))
    names = [str(d.schedule.name) for d in declared]
    with transaction.atomic(using=using):
        now = database_now(using=using)
        rows = [_sync_row(d, now) for d in declared]
        dropped = _dropped_by_sync(declared, now, using)
        with connections[using].cursor() as cursor:
            if rows:
                cursor.execute(sql.query("sync_schedules"), [json.dumps(rows, default=str)])
                for name, inserted in cursor.fetchall():
                    (report.added if inserted else report.changed).append(name)
            cursor.execute(sql.query("retire_schedules"), [names])
            report.retired = sorted(row[0] for row in cursor.fetchall())
            cursor.execute(sql.query("admin_schedules_named"), [names])
            report.conflicts = [row[0] for row in cursor.fetchall()]
        for name, counters in dropped.items():
            models.Schedule.objects.using(using).filter(name=name).update(**counters)
    for name in report.conflicts:
        logger.warning("schedule.conflict name=%s: declared in code or settings, but an "
                       "operator's schedule has the name; the operator's is kept", name)
    if report.added or report.changed or report.retired:
        logger.info("schedule.sync added=%s changed=%s retired=%s",
                    ",".join(sorted(report.added)) or "-",
                    ",".join(sorted(report.changed)) or "-", ",".join(report.retired) or "-")
    return report


def _dropped_by_sync(declared: Sequence[Declared], now: datetime, using: str) -> dict[str, Any]:
    """The counters of the due ticks a declaration's new expression or zone will not run.

    Locks the declared rows the sync is about to move (in name order, as every sync does), so
    no pass enqueues those ticks between this count and the write that moves the cursor.
    """
    new = {str(d.schedule.name): (d.schedule.cron, d.schedule.timezone) for d in declared}
    stored = (models.Schedule.objects.using(using).select_for_update()
              .filter(name__in=list(new), retired_at=None)
              .exclude(source=ScheduleSource.ADMIN).order_by("name"))
    dropped = {}
    for row in stored:
        if (row.cron, row.timezone) != new[row.name]:
            counters = _dropped_ticks(row, now)
            if counters:
                dropped[row.name] = counters
    return dropped


def _sync_row(declared: Declared, now: datetime) -> dict[str, Any]:
    s = declared.schedule
    return {
        "name": s.name, "task": s.task, "cron": s.cron, "timezone": s.timezone,
        "payload": s.payload, "queue": s.queue or "", "priority": s.priority,
        "misfire": str(s.misfire), "catch_up_limit": s.catch_up_limit,
        "overlap": str(s.overlap), "source": declared.source.value,
        "next_tick_at": next_tick(s.cron, s.timezone, now),
    }


# --- the schedule step -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Due:
    """A due schedule as ``due_schedules`` returns it (read by column name)."""

    id: int
    name: str
    task: str
    cron: str
    timezone: str
    payload: Any
    queue: str
    priority: int | None
    misfire: str
    catch_up_limit: int
    overlap: str
    next_tick_at: datetime
    last_job_id: int | None
    previous_busy: bool
    db_now: datetime

    @classmethod
    def read(cls, columns: Sequence[str], row: Sequence[Any]) -> _Due:
        values = dict(zip(columns, row, strict=True))
        # A raw cursor may hand jsonb back as text (Django's psycopg set-up does).
        if isinstance(values["payload"], str):
            values["payload"] = json.loads(values["payload"])
        return cls(**values)


_refused_logged_at: dict[str, float] = {}
_failed_logged_at: dict[str, float] = {}


def enqueue_due_ticks(
    *, using: str = DEFAULT_DB_ALIAS, now: datetime | None = None, limit: int | None = None
) -> int:
    """Enqueue one bounded batch of due ticks; return how many ticks were handled.

    Handled means enqueued, passed over by the misfire policy or skipped by the overlap policy;
    a full batch means there may be more (the step then runs again at once). ``now`` replaces
    the database clock (tests walk a schedule through a DST day with it).
    """
    budget = int(settings.SCHEDULE_BATCH if limit is None else limit)
    grace = float(settings.SCHEDULE_GRACE_SECONDS)
    handled = 0
    with transaction.atomic(using=using):
        with connections[using].cursor() as cursor:
            cursor.execute(sql.query("due_schedules"),
                           {"now": now, "tasks": registry.names(), "limit": budget,
                            "hold": f"{PASS_HOLD_SECONDS}s"})
            columns = [column.name for column in cursor.description]
            due = [_Due.read(columns, row) for row in cursor.fetchall()]
        specs: list[JobSpec] = []
        updates: list[dict[str, Any]] = []
        failures: list[dict[str, Any]] = []
        for schedule in due:
            if handled >= budget:
                break  # left locked until commit, untouched: the next pass takes it
            try:
                if not _enqueueable(schedule):
                    continue
                update = _planned(schedule, grace, budget - handled)
            except Exception as exc:  # one schedule must not stop the others
                failures.append({"id": schedule.id, "error": _failed(schedule, exc)})
                continue
            _failed_logged_at.pop(schedule.name, None)
            handled += update["enqueued"] + update["skipped"] + update["missed"]
            specs += [spec_for(schedule, Tick(schedule.id, tick)) for tick in update["run"]]
            updates.append(update)
        jobs = enqueue_many(specs, using=using) if specs else []
        last_jobs = {job.schedule_id: job for job in jobs}
        for update in updates:
            job = last_jobs.get(update["id"])
            update["last_job_id"] = job.pk if job is not None else None
        if updates:
            with connections[using].cursor() as cursor:
                cursor.execute(sql.query("advance_schedules"), [json.dumps(
                    [{k: v for k, v in u.items() if k not in ("run", "skipped_ticks")}
                     for u in updates], default=str)])
        if failures:
            with connections[using].cursor() as cursor:
                cursor.execute(sql.query("record_schedule_errors"), [json.dumps(failures)])
    _log_pass(due, updates, jobs)
    return handled


def _planned(schedule: _Due, grace: float, room: int) -> dict[str, Any]:
    """What this pass does with ``schedule``: its ticks to run and skip, cursor and counters."""
    plan = plan_ticks(
        schedule.cron, schedule.timezone, cursor=schedule.next_tick_at,
        now=schedule.db_now, grace_seconds=grace, misfire=schedule.misfire,
        catch_up_limit=schedule.catch_up_limit, limit=room,
    )
    run, skipped = list(plan.run), []
    if schedule.overlap == OverlapPolicy.SKIP:
        # One job at a time: none while the last one waits or runs, and of several due at once
        # only the latest (the others would wait alongside it).
        keep = 0 if schedule.previous_busy else 1
        skipped, run = run[:len(run) - keep], run[len(run) - keep:]
    return {
        "id": schedule.id, "next_tick_at": plan.cursor,
        "last_tick_at": plan.last_handled, "last_job_id": None,
        "enqueued": len(run), "missed": plan.missed, "skipped": len(skipped),
        **_last_skip(skipped, plan.passed_over),
        "run": run, "skipped_ticks": skipped,
    }


def _failed(schedule: _Due, exc: Exception) -> str:
    """``exc`` as ``schedule.last_error`` keeps it: one line, scrubbed; log it (rarely)."""
    text = redactor_for(schedule.task).text(f"{type(exc).__name__}: {exc}", schedule.payload)
    text = escape_control(text)[:LAST_ERROR_MAX_CHARS]
    # A lone surrogate has no place in PostgreSQL text.
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if _remind(_failed_logged_at, schedule.name):
        logger.error("schedule.failed name=%s task=%s: its ticks could not be planned (%s); its "
                     "cursor stays, the other schedules go on, and it shows as late",
                     schedule.name, schedule.task, text)
    return text


def _remind(logged_at: dict[str, float], name: str) -> bool:
    """Whether a lasting problem of schedule ``name`` is due to be logged again."""
    last = logged_at.get(name)
    if last is not None and time.monotonic() - last < REFUSED_REMIND_SECONDS:
        return False
    logged_at[name] = time.monotonic()
    return True


def _last_skip(overlapped: list[datetime], missed: datetime | None) -> dict[str, Any]:
    """The latest tick that did not run in this pass, and why."""
    last = overlapped[-1] if overlapped else None
    if last is not None and (missed is None or last >= missed):
        return {"last_skipped_at": last, "skip_reason": SkipReason.OVERLAP.value}
    if missed is not None:
        return {"last_skipped_at": missed, "skip_reason": SkipReason.MISFIRE.value}
    return {"last_skipped_at": None, "skip_reason": ""}


def _enqueueable(schedule: _Due) -> bool:
    """Whether this schedule's jobs pass enqueue's rules now; log (rarely) when they do not."""
    try:
        validate(spec_for(schedule, Tick(schedule.id, schedule.next_tick_at)))
    except EnqueueError as exc:
        if _remind(_refused_logged_at, schedule.name):
            logger.error("schedule.refused name=%s task=%s: its jobs are refused (%s); its "
                         "ticks wait, and it shows as late", schedule.name, schedule.task,
                         escape_control(str(exc)))
        return False
    _refused_logged_at.pop(schedule.name, None)
    return True


def _log_pass(due: Sequence[_Due], updates: Sequence[dict[str, Any]], jobs: Sequence[Job]) -> None:
    by_id = {schedule.id: schedule for schedule in due}
    created = {job.scheduled_at for job in jobs if job.created}
    for update in updates:
        schedule = by_id[update["id"]]
        if update["missed"]:
            logger.warning(
                "schedule.missed name=%s ticks=%d policy=%s: no worker enqueued them within "
                "PGJOBS_SCHEDULE_GRACE_SECONDS", schedule.name, update["missed"], schedule.misfire,
                extra={"pgjobs": {"schedule": schedule.name, "missed": update["missed"]}},
            )
        if update["skipped"]:
            logger.info(
                "schedule.skipped name=%s ticks=%d reason=overlap last=%s: the previous tick's "
                "job had not finished", schedule.name, update["skipped"],
                update["skipped_ticks"][-1].isoformat(),
                extra={"pgjobs": {"schedule": schedule.name, "skipped": update["skipped"]}},
            )
        for tick in update["run"]:
            if tick in created:
                logger.info("schedule.enqueued name=%s tick=%s", schedule.name, tick.isoformat(),
                            extra={"pgjobs": {"schedule": schedule.name,
                                              "scheduled_at": tick.isoformat()}})


class ScheduleStep:
    """The maintenance step: sync the declared schedules once, then enqueue due ticks.

    The sync runs on the first call (at worker start) and again on later calls until it has
    succeeded once, so a database that is down at start delays it instead of skipping it.
    """

    def __init__(self) -> None:
        self.synced = False

    def __call__(self, using: str = DEFAULT_DB_ALIAS) -> int:
        if not self.synced:
            sync_declared(using=using)
            self.synced = True
        return enqueue_due_ticks(using=using)


# --- operators ---------------------------------------------------------------------------------
# Each locks the selected schedules in id order, changes the ones its guard allows, and writes
# its audit row in the same transaction.


def pause_schedules(
    ids: Iterable[int], *, actor: Actor = CODE, reason: str = "", using: str = DEFAULT_DB_ALIAS
) -> int:
    """Stop active schedules from ticking; their cursor waits for a resume."""
    selected = unique_ids(ids)
    with transaction.atomic(using=using):
        before = _lock(selected, using)
        eligible = [i for i, row in before.items() if row.state == "active"]
        now = database_now(using=using)
        paused = models.Schedule.objects.using(using).filter(
            pk__in=eligible, paused_at__isnull=True, retired_at__isnull=True
        ).update(paused_at=now, updated_at=now)
        audit_schedule_action(OperatorActionKind.SCHEDULE_PAUSE, actor, reason, selected, paused,
                              {"before": _states(before), "paused": eligible}, using=using)
    return paused


def resume_schedules(
    ids: Iterable[int], *, actor: Actor = CODE, reason: str = "", using: str = DEFAULT_DB_ALIAS
) -> int:
    """Let paused schedules tick again from their next tick after now.

    Ticks that fell while a schedule was paused do not run: a pause means "not now".
    """
    selected = unique_ids(ids)
    with transaction.atomic(using=using):
        before = _lock(selected, using)
        now = database_now(using=using)
        resumed = []
        for schedule_id, row in before.items():
            if row.state != "paused":
                continue
            resumed.append(schedule_id)
            models.Schedule.objects.using(using).filter(
                pk=schedule_id, paused_at__isnull=False, retired_at__isnull=True
            ).update(paused_at=None, next_tick_at=next_tick(row.cron, row.timezone, now),
                     updated_at=now)
        audit_schedule_action(OperatorActionKind.SCHEDULE_RESUME, actor, reason, selected,
                              len(resumed), {"before": _states(before), "resumed": resumed},
                              using=using)
    return len(resumed)


def run_schedules_now(
    ids: Iterable[int], *, actor: Actor = CODE, reason: str = "", using: str = DEFAULT_DB_ALIAS
) -> list[Job]:
    """Enqueue one job for each selected schedule now, outside its ticks.

    The job carries the schedule and the time it was asked for (``ctx.scheduled_at``) and
    counts as the schedule's last job (an overlap ``skip`` waits for it). Retired schedules,
    and those whose jobs enqueue refuses, get none. The cursor does not move.
    """
    selected = unique_ids(ids)
    with transaction.atomic(using=using):
        before = _lock(selected, using)
        now = database_now(using=using)
        runnable = [row for row in before.values() if row.state != "retired"
                    and registry.get(row.task) is not None]
        jobs = enqueue_many([spec_for(row, Tick(row.pk, now)) for row in runnable], using=using)
        for row, job in zip(runnable, jobs, strict=True):
            models.Schedule.objects.using(using).filter(pk=row.pk).update(last_job_id=job.pk,
                                                                      updated_at=now)
        audit_schedule_action(
            OperatorActionKind.SCHEDULE_RUN_NOW, actor, reason, selected, len(jobs),
            {"before": _states(before),
             "enqueued": {str(row.pk): job.pk for row, job in zip(runnable, jobs, strict=True)}},
            job_ids=[job.pk for job in jobs], using=using,
        )
    return jobs


def save_schedule(
    row: models.Schedule, *, created: bool, before: dict[str, Any] | None = None,
    actor: Actor = CODE, using: str = DEFAULT_DB_ALIAS,
) -> None:
    """Save an operator's new or edited schedule and audit it, in one transaction.

    The row must pass ``row_problem``. ``before`` is the definition as the operator's form read
    it: an edit writes only the fields that differ from it (and the name), under the row's
    lock, so what workers wrote meanwhile (counters, last job, cursor) stays. A new schedule,
    or one whose expression or zone changed, ticks next at its first tick after now; the ticks
    of the old expression that were due and not yet enqueued count as missed.
    """
    problem = row_problem(row)
    if problem is not None:
        raise InvalidJobOption(problem)
    with transaction.atomic(using=using):
        if created:
            now = database_now(using=using)
            row.next_tick_at = next_tick(row.cron, row.timezone, now)
            row.source = ScheduleSource.ADMIN
            row.updated_at = now
            row.save(using=using)
            read: dict[str, Any] = {}
        else:
            read = _change(row, before, using)
        redactor = redactor_for(row.task)
        after = _definition(row, redactor)
        if created:
            kind, detail = OperatorActionKind.SCHEDULE_CREATE, {"definition": after}
        else:
            kind = OperatorActionKind.SCHEDULE_CHANGE
            # Compared as stored, shown redacted: a changed secret shows as changed.
            detail = {"changed": {
                k: [redactor.payload(read[k]) if k == "payload" else read[k], after[k]]
                for k in DEFINITION if k in read}}
        audit_schedule_action(kind, actor, "", [row.pk], 1, detail, using=using)


def _change(row: models.Schedule, before: dict[str, Any] | None, using: str) -> dict[str, Any]:
    """Write the fields of ``row`` the operator changed from ``before``; return their old values.

    Locks the row first (workers' passes hold it while they enqueue its ticks).
    """
    stored = models.Schedule.objects.using(using).select_for_update().get(pk=row.pk)
    now = database_now(using=using)
    read = {f: (before[f] if before is not None and f in before else getattr(stored, f))
            for f in ("name", *DEFINITION)}
    edited = {f: getattr(row, f) for f, value in read.items() if getattr(row, f) != value}
    changes: dict[str, Any] = {**edited, "updated_at": now}
    cron, zone_name = edited.get("cron", stored.cron), edited.get("timezone", stored.timezone)
    if (cron, zone_name) != (stored.cron, stored.timezone):
        row.next_tick_at = changes["next_tick_at"] = next_tick(cron, zone_name, now)
        changes.update(_dropped_ticks(stored, now))
    models.Schedule.objects.using(using).filter(pk=row.pk).update(**changes)
    return {f: read[f] for f in edited}


def _dropped_ticks(stored: models.Schedule, now: datetime) -> dict[str, Any]:
    """The counters of the due ticks an active schedule's old expression or zone no longer runs.

    They were due (at or before now) and no pass had enqueued them yet: they are missed, as if
    the misfire policy had passed them over, so every tick stays accounted for.
    """
    if stored.state != "active" or stored.next_tick_at is None or stored.next_tick_at > now:
        return {}
    try:
        count, latest = due_count(stored.cron, stored.timezone, stored.next_tick_at, now)
    except Exception:  # the old definition no longer reads: this edit is its fix
        return {}
    if not count:
        return {}
    logger.warning("schedule.missed name=%s ticks=%d policy=%s: its expression or zone changed "
                   "before they were enqueued", stored.name, count, stored.misfire,
                   extra={"pgjobs": {"schedule": stored.name, "missed": count}})
    return {"ticks_missed": F("ticks_missed") + count, "last_skipped_at": latest,
            "last_skip_reason": SkipReason.MISFIRE.value}


def row_problem(row: models.Schedule) -> str | None:
    """What keeps ``row`` from being a schedule (the same rules as a declaration), or None."""
    try:
        declaration = declaration_of(row)
    except InvalidJobOption as exc:
        return str(exc)
    return job_problem(declaration)


def _definition(row: models.Schedule, redactor: Redactor) -> dict[str, Any]:
    values = {f: getattr(row, f) for f in DEFINITION}
    values["payload"] = redactor.payload(row.payload)
    return values


def _lock(ids: list[int], using: str) -> dict[int, models.Schedule]:
    rows = (models.Schedule.objects.using(using).select_for_update()
            .filter(pk__in=ids).order_by("id"))
    return {row.pk: row for row in rows}


def _states(rows: dict[int, models.Schedule]) -> dict[str, int]:
    return counts_by_state(row.state for row in rows.values())


__all__ = [
    "DEFINITION",
    "Declared",
    "ScheduleStep",
    "SyncReport",
    "declaration_of",
    "declared_schedules",
    "enqueue_due_ticks",
    "job_problem",
    "pause_schedules",
    "resume_schedules",
    "row_problem",
    "run_schedules_now",
    "save_schedule",
    "settings_schedule",
    "spec_for",
    "sync_declared",
    "upcoming_ticks",
]
