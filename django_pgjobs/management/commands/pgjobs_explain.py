"""manage.py pgjobs_explain: the plans of the claim and the other hot queries, checked."""

from __future__ import annotations

import argparse
import math
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from django_pgjobs.explain import DEFAULT_MAX_ROWS_FACTOR, HOT_QUERIES, explain
from django_pgjobs.management.arguments import queue_name, whole_number
from django_pgjobs.transitions import claim_statement


def _factor(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


class Command(BaseCommand):
    help = (
        "Run the real claim query (and, with --query, the other hot queries) under EXPLAIN "
        "(ANALYZE, BUFFERS) inside a transaction that is rolled back; print each plan with the "
        "rows and buffers it touched. Exits non-zero when a query does not use its index or "
        "reads far more rows than its batch."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--queue", "-q", type=queue_name, default="default",
                            help="queue to claim from (default: default)")
        parser.add_argument("--batch-size", type=whole_number(1, 100_000), default=10,
                            help="claim batch size, the LIMIT of each query (default 10)")
        parser.add_argument("--query", action="append", dest="queries",
                            choices=[*HOT_QUERIES, "all"],
                            help="hot query to check (repeatable; default claim)")
        parser.add_argument("--max-rows-factor", type=_factor, default=DEFAULT_MAX_ROWS_FACTOR,
                            help="how many times its expected rows a query may read before it "
                                 f"counts as a problem (default {DEFAULT_MAX_ROWS_FACTOR:g})")
        parser.add_argument("--database", default="default", help="database alias")
        parser.add_argument("--show-sql", action="store_true",
                            help="print the claim's whole statement as it is sent first "
                                 "(%%(queue)s and %%(worker_id)s stand for its two values)")

    def handle(self, *args: Any, **options: Any) -> None:
        using = options["database"]
        if using not in connections:
            raise CommandError(f"unknown database alias {using!r}")
        if options["show_sql"]:
            self.stdout.write(claim_statement(options["batch_size"]).text)
            self.stdout.write("")
        chosen = options["queries"] or ["claim"]
        names = list(HOT_QUERIES) if "all" in chosen else list(dict.fromkeys(chosen))
        failed = []
        for name in names:
            report = explain(name, queue=options["queue"], batch=options["batch_size"],
                             max_rows_factor=options["max_rows_factor"], using=using)
            self.stdout.write(report.render())
            self.stdout.write("")
            if not report.ok:
                failed.append(name)
        if failed:
            raise CommandError(f"plan check failed for: {', '.join(failed)}")
