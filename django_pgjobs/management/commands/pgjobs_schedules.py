"""manage.py pgjobs_schedules: every schedule, its state, last tick and next ticks."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections
from django.utils import timezone

from django_pgjobs.management.arguments import whole_number
from django_pgjobs.models import Job, Schedule
from django_pgjobs.schedules import upcoming_ticks
from django_pgjobs.ticks import zone
from django_pgjobs.validation import escape_control


class Command(BaseCommand):
    help = ("List the schedules (declared in code, in PGJOBS_SCHEDULES, or by operators) with "
            "their state, last tick and job, and next ticks in their time zone.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print JSON instead of a list")
        parser.add_argument("--count", type=whole_number(1, 100), default=5,
                            help="next ticks to show per schedule (default 5)")
        parser.add_argument("--all", action="store_true",
                            help="include retired schedules (left out by default)")
        parser.add_argument("--database", default="default", help="database alias")

    def handle(self, *args: Any, **options: Any) -> None:
        using = options["database"]
        if using not in connections:
            raise CommandError(f"unknown database alias {using!r}")
        rows = Schedule.objects.using(using).order_by("name")
        if not options["all"]:
            rows = rows.filter(retired_at__isnull=True)
        schedules = list(rows)
        last_jobs = dict(Job.objects.using(using).filter(
            pk__in=[s.last_job_id for s in schedules if s.last_job_id is not None]
        ).values_list("id", "status"))
        now = timezone.now()
        described = [_describe(s, last_jobs, now, options["count"]) for s in schedules]
        if options["json"]:
            self.stdout.write(json.dumps(described, indent=2, default=str))
            return
        if not described:
            self.stdout.write("No schedules.")
            return
        for entry in described:
            self.stdout.write(
                f"{entry['name']}  [{entry['state']}, {entry['source']}]  {entry['task']}  "
                f"{entry['cron']!r} {entry['timezone']}  misfire={entry['misfire']} "
                f"overlap={entry['overlap']}"
            )
            last = entry["last_tick_at"] or "-"
            job = (f"job {entry['last_job_id']} {entry['last_job_status'] or 'pruned'}"
                   if entry["last_job_id"] else "no job yet")
            self.stdout.write(
                f"  last tick {last} ({job}); enqueued {entry['ticks_enqueued']}, missed "
                f"{entry['ticks_missed']}, skipped {entry['ticks_skipped']}"
            )
            if entry["last_error"]:
                self.stdout.write(f"  failing since {entry['last_error_at']}: "
                                  f"{escape_control(entry['last_error'])}")
            label = "next if resumed" if entry["state"] == "paused" else "next"
            self.stdout.write(f"  {label}: " + (", ".join(entry["next_ticks"]) or "-"))


def _describe(
    schedule: Schedule, last_jobs: dict[int, str], now: Any, count: int
) -> dict[str, Any]:
    local = zone(schedule.timezone)
    return {
        "name": schedule.name, "task": schedule.task, "state": schedule.state,
        "source": schedule.source, "cron": schedule.cron, "timezone": schedule.timezone,
        "misfire": schedule.misfire, "catch_up_limit": schedule.catch_up_limit,
        "overlap": schedule.overlap, "queue": schedule.queue or None,
        "priority": schedule.priority,
        "next_tick_at": _iso(schedule.next_tick_at),
        "last_tick_at": _iso(schedule.last_tick_at),
        "last_job_id": schedule.last_job_id,
        "last_job_status": last_jobs.get(schedule.last_job_id or 0),
        "ticks_enqueued": schedule.ticks_enqueued, "ticks_missed": schedule.ticks_missed,
        "ticks_skipped": schedule.ticks_skipped,
        "last_skipped_at": _iso(schedule.last_skipped_at),
        "last_skip_reason": schedule.last_skip_reason or None,
        "last_error": schedule.last_error or None,
        "last_error_at": _iso(schedule.last_error_at),
        "next_ticks": [t.astimezone(local).isoformat()
                       for t in upcoming_ticks(schedule, count, now)],
    }


def _iso(value: Any) -> str | None:
    return None if value is None else value.isoformat()
