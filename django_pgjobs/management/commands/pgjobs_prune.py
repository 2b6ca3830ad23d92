"""manage.py pgjobs_prune: delete finished jobs, their attempts and expired receipts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from django_pgjobs.conf import settings
from django_pgjobs.maintenance import (
    count_expired_receipts,
    count_prunable_jobs,
    prune_jobs,
    prune_receipts,
    retention_seconds,
)
from django_pgjobs.management.arguments import whole_number
from django_pgjobs.status import JobStatus

STATES = [JobStatus.SUCCEEDED.value, JobStatus.CANCELLED.value, JobStatus.DEAD.value]


class Command(BaseCommand):
    help = (
        "Delete jobs that finished longer ago than PGJOBS_RETENTION_SECONDS allows for their "
        "state, with their attempts, and idempotency receipts past their expiry. Works in "
        "batches, one short transaction each; never touches a job that can still run."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--state", action="append", choices=[*STATES, "receipts"],
                            dest="states", help="prune only this (repeatable); default: all")
        parser.add_argument("--batch-size", type=whole_number(1), default=None,
                            help="rows per transaction (default PGJOBS_PRUNE_BATCH)")
        parser.add_argument("--max-batches", type=whole_number(1), default=None,
                            help="stop each state after this many batches (default: no limit)")
        parser.add_argument("--dry-run", action="store_true",
                            help="count what would be deleted, delete nothing")
        parser.add_argument("--database", default="default", help="database alias")

    def handle(self, *args: Any, **options: Any) -> None:
        using = options["database"]
        if using not in connections:
            raise CommandError(f"unknown database alias {using!r}")
        batch = options["batch_size"] or int(settings.PRUNE_BATCH)
        chosen = options["states"] or [*STATES, "receipts"]
        self._tty = self.stdout.isatty()
        for state in [s for s in [*STATES, "receipts"] if s in chosen]:
            if state == "receipts":
                self._receipts(batch, options, using)
            else:
                self._jobs(state, batch, options, using)

    def _jobs(self, state: str, batch: int, options: dict[str, Any], using: str) -> None:
        retention = retention_seconds(state)
        if retention is None:
            self.stdout.write(f"{state}: kept forever (PGJOBS_RETENTION_SECONDS)")
            return
        age = f"finished over {retention:g}s ago"
        if options["dry_run"]:
            count = count_prunable_jobs(state, using=using)
            self.stdout.write(f"{state}: would delete {count} jobs ({age})")
            return
        totals = [0, 0]

        def one_batch() -> int:
            jobs, attempts = prune_jobs(state, retention, batch, using=using)
            totals[0] += jobs
            totals[1] += attempts
            return jobs

        def line() -> str:
            return f"{state}: deleted {totals[0]} jobs and {totals[1]} attempts ({age})"

        self._batches(one_batch, batch, options["max_batches"], line)

    def _receipts(self, batch: int, options: dict[str, Any], using: str) -> None:
        if options["dry_run"]:
            count = count_expired_receipts(using=using)
            self.stdout.write(f"receipts: would delete {count} expired receipts")
            return
        total = [0]

        def one_batch() -> int:
            deleted = prune_receipts(batch, using=using)
            total[0] += deleted
            return deleted

        self._batches(one_batch, batch, options["max_batches"],
                      lambda: f"receipts: deleted {total[0]} expired receipts")

    def _batches(
        self, one_batch: Callable[[], int], batch: int, max_batches: int | None,
        line: Callable[[], str],
    ) -> None:
        """Run batches until one comes back short (or the limit); show progress on a terminal."""
        done = 0
        more = True
        while more and (max_batches is None or done < max_batches):
            more = one_batch() >= batch
            done += 1
            if self._tty:
                self.stdout.write(f"\r{line()}", ending="")
                self.stdout.flush()
        summary = line() + (f"; stopped after {done} batches, more may remain" if more else "")
        self.stdout.write(f"\r{summary}" if self._tty else summary)
