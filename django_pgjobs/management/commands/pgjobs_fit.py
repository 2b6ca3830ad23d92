"""manage.py pgjobs_fit: measure the live workload and answer the decision record's questions."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from django_pgjobs.fit import Answer, Measurements, Verdict, judge, measure
from django_pgjobs.management.arguments import seconds


class Command(BaseCommand):
    help = ("Measure the live workload and say, for each question of the decision record, "
            "whether it is comfortably within PostgreSQL, to watch, or outgrowing it.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--sample-seconds", type=seconds(0, 300), default=5.0,
                            help="watch enqueues for this long to measure the live rate "
                                 "(0 skips it; default 5)")
        parser.add_argument("--json", action="store_true", help="print JSON")
        parser.add_argument("--database", default="default", help="database alias")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["database"] not in connections:
            raise CommandError(f"unknown database alias {options['database']!r}")
        measured = measure(sample_seconds=options["sample_seconds"], using=options["database"])
        answers = judge(measured)
        if options["json"]:
            self.stdout.write(json.dumps(_as_json(measured, answers), indent=2, default=str))
            return
        self.stdout.write("\n".join([*_measurements(measured), "", *_answers(answers)]))


def _as_json(m: Measurements, answers: list[Answer]) -> dict[str, Any]:
    data = asdict(m)
    data["dead_tuple_ratio"] = m.dead_tuple_ratio
    data["database_share"] = m.database_share
    return {
        "measurements": data,
        "answers": [{"question": a.question, "verdict": a.verdict.name.lower(),
                     "verdict_text": a.verdict.value, "reasons": a.reasons,
                     "consider": a.consider if a.verdict != Verdict.COMFORTABLE else ""}
                    for a in answers],
    }


def _measurements(m: Measurements) -> list[str]:
    def fmt(value: float | None, unit: str = "", digits: int = 1) -> str:
        return "-" if value is None else f"{value:,.{digits}f}{unit}"

    rows = [
        ("enqueue rate (live)", "not sampled" if m.enqueue_per_second is None
         else f"{m.enqueue_per_second:,.1f}/s over {m.sample_seconds:g}s"),
        ("claim rate (last hour)", f"{m.claims_per_second:,.2f}/s"),
        ("peak minute finished", f"{m.peak_finished_per_minute:,}/min"),
        ("pickup latency p95", fmt(m.pickup_p95_seconds, " s", 2)),
        ("backlog", f"{m.backlog:,} waiting, oldest ready {fmt(m.oldest_ready_age_seconds, ' s')}"),
        ("payload p95 / max", f"{fmt(m.payload_p95_bytes, ' B', 0)} / "
                              f"{fmt(m.payload_max_bytes, ' B', 0)} "
                              f"(newest {m.payload_samples:,}, limit {m.payload_limit_bytes:,} B)"),
        ("job table + indexes", f"{m.job_table_bytes:,} B + {m.job_index_bytes:,} B"),
        ("attempt table", f"{m.attempt_total_bytes:,} B"),
        ("dead tuple ratio", "-" if m.dead_tuple_ratio is None else f"{m.dead_tuple_ratio:.1%}"),
        ("last vacuum", str(m.last_vacuum) if m.last_vacuum else "never"),
    ]
    width = max(len(name) for name, _ in rows)
    return ["Measured"] + [f"  {name.ljust(width)}  {value}" for name, value in rows]


def _answers(answers: list[Answer]) -> list[str]:
    lines = []
    for answer in answers:
        lines.append(f"{answer.question}: {answer.verdict.value.upper()}")
        lines += [f"  {reason}" for reason in answer.reasons]
        if answer.verdict != Verdict.COMFORTABLE:
            lines.append(f"  consider: {answer.consider}")
        lines.append("")
    return lines
