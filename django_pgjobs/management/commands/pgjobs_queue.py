"""manage.py pgjobs_queue: pause, resume and list queues."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from django_pgjobs import stats, transitions
from django_pgjobs.management.arguments import queue_name
from django_pgjobs.models import QueueState
from django_pgjobs.validation import escape_control


class Command(BaseCommand):
    help = ("Pause a queue (workers stop claiming from it within a second; enqueue still works), "
            "resume it, or list the queues with their state and backlog.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", default="default", help="database alias")
        actions = parser.add_subparsers(dest="action", required=True, metavar="pause|resume|list")
        for name, text in (("pause", "stop claiming from QUEUE"),
                           ("resume", "claim from QUEUE again")):
            action = actions.add_parser(name, help=text)
            action.add_argument("queue", type=queue_name, help="the queue's name")
            action.add_argument("--reason", default="", help="recorded in the audit trail")
        listing = actions.add_parser("list", help="every known queue, paused or not")
        listing.add_argument("--json", action="store_true", help="print JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        using = options["database"]
        if using not in connections:
            raise CommandError(f"unknown database alias {using!r}")
        if options["action"] == "list":
            self._list(using, as_json=options["json"])
            return
        queue = options["queue"]
        change = transitions.pause_queue if options["action"] == "pause" else (
            transitions.resume_queue)
        changed = change(queue, actor=transitions.Actor("manage.py pgjobs_queue"),
                         reason=options["reason"], using=using)
        state = "paused" if options["action"] == "pause" else "active"
        self.stdout.write(f"queue {queue}: {state}" + ("" if changed else " (it already was)"))

    def _list(self, using: str, *, as_json: bool) -> None:
        queues = {q.queue: q for q in stats.queue_stats(using=using)}
        states = {s.name: s for s in QueueState.objects.using(using).order_by("name")}
        rows: list[dict[str, Any]] = []
        for name in sorted({*queues, *states}):
            q, state = queues.get(name), states.get(name)
            rows.append({
                "queue": name, "paused": bool(state and state.paused),
                "ready": q.ready if q else 0, "running": q.running if q else 0,
                "oldest_ready_age_seconds": q.oldest_ready_age_seconds if q else None,
                "changed_at": state.changed_at.isoformat() if state else None,
                "changed_by": state.changed_by if state else "",
                "reason": state.reason if state else "",
            })
        if as_json:
            self.stdout.write(json.dumps(rows, indent=2))
            return
        if not rows:
            self.stdout.write("(no queues)")
        for row in rows:
            age = row["oldest_ready_age_seconds"]
            # Whoever paused the queue wrote the actor and the reason (the admin takes any
            # text): escaped, a newline cannot forge a line of this listing, nor an escape
            # sequence drive the terminal.
            changed_by, reason = escape_control(row["changed_by"]), escape_control(row["reason"])
            self.stdout.write(
                f"{row['queue']:<24} {'PAUSED' if row['paused'] else 'active':<7} "
                f"ready={row['ready']} running={row['running']} "
                f"oldest_ready={'-' if age is None else f'{age:.1f}s'}"
                + (f"  (since {row['changed_at']} by {changed_by or '-'}"
                   f"{': ' + reason if reason else ''})" if row["paused"] else "")
            )
