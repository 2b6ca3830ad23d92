"""How the admin shows things: durations, counts of jobs, JSON, estimated counts, searches."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime, tzinfo
from typing import Any

from django.contrib import admin
from django.core.exceptions import EmptyResultSet, PermissionDenied
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import QuerySet
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from .. import sql
from ..models import Attempt, Job
from ..registry import redactor_for
from ..status import JobStatus

# Above this many rows (by the planner's estimate) the changelist shows the estimate.
EXACT_COUNT_MAX_ROWS = 100_000
# The deepest page a list shows: page p skips (p - 1) * 50 rows, each read from the index.
# Further back, filter or search.
MAX_PAGES = 200
PREVIEW_MAX_CHARS = 80


def duration_text(seconds: float) -> str:
    """Say a duration the way an operator reads it: ``45s``, ``12m 5s``, ``3h 20m``, ``2d 4h``."""
    seconds = int(max(seconds, 0))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"


def time_text(instant: datetime | None, zone: tzinfo | None = None) -> str:
    """Say an instant one way everywhere: ``2026-03-02 07:04:05.123 UTC``, ``-`` for none.

    To the millisecond, with the zone: a lease expiry, a heartbeat and a claim a second apart,
    or five attempts with backoff, read apart. In ``zone`` (a schedule's), else the current one.
    """
    if instant is None:
        return "-"
    local = instant.astimezone(zone) if zone is not None else timezone.localtime(instant)
    return f"{local:%Y-%m-%d %H:%M:%S}.{local.microsecond // 1000:03d} {local:%Z}"


def time_column(field: str, *, sortable: bool = False) -> Any:
    """An admin column or read-only field that shows the model's time ``field`` by ``time_text``."""

    def shown(self: Any, obj: Any) -> str:
        return time_text(getattr(obj, field))

    shown.__name__ = f"{field}_shown"
    description = field.replace("_", " ")
    return admin.display(description=description, ordering=field if sortable else None)(shown)


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def preview(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= PREVIEW_MAX_CHARS else text[: PREVIEW_MAX_CHARS - 1] + "…"


# Each status's badge colour: what needs an operator (bad), what runs or may (live), what waits
# for a time or a slot (waiting), what is done (good). The badge always says the status too.
STATUS_TONES: dict[str, str] = {
    JobStatus.DEAD: "bad", JobStatus.RUNNING: "live", JobStatus.READY: "live",
    JobStatus.SUCCEEDED: "good",
}


def status_badge(status: str) -> SafeString:
    """A job status as text in a coloured frame: never colour alone."""
    return format_html('<span class="pgjobs-status pgjobs-status-{}">{}</span>',
                       STATUS_TONES.get(status, "wait"), status)


def breakable(name: str) -> SafeString:
    """A dotted name that may wrap after each dot (``billing.<wbr>charge``), never inside a
    word: a narrow column wraps it where a reader would."""
    return format_html_join(mark_safe("<wbr>"), "{}", ((part,) for part in _after_dots(name)))


def _after_dots(name: str) -> list[str]:
    parts = name.split(".")
    return [p + "." for p in parts[:-1]] + parts[-1:]


def one_line(text: str) -> SafeString:
    """Text kept on one line, cut with an ellipsis where its column ends; whole on hover."""
    return format_html('<span class="pgjobs-one-line" title="{}">{}</span>', text, text)


def jobs_text(n: int) -> str:
    return f"{n} job" if n == 1 else f"{n} jobs"


def is_are(n: int) -> str:
    return "is" if n == 1 else "are"


def states_text(counts: dict[str, int], statuses: Iterable[str]) -> tuple[int, str]:
    """Total and ``"3 dead, 1 cancelled"`` for the given statuses, in state-machine order."""
    parts = [(s, counts[s]) for s in JobStatus.values if s in statuses and counts.get(s)]
    return sum(n for _, n in parts), ", ".join(f"{n} {s}" for s, n in parts)


def attempt_error_html(attempt: Attempt, job: Job) -> str:
    """The attempt's error and collapsed traceback, with the job's secrets scrubbed out."""
    redactor = redactor_for(job.task)
    error = redactor.text(attempt.error, job.payload)
    if not attempt.traceback:
        return format_html("{}", error or "-")
    return format_html(
        '{}<details><summary>traceback</summary><pre class="pgjobs-traceback">{}</pre></details>',
        error or "-", redactor.text(attempt.traceback, job.payload),
    )


def searchable(term: str) -> bool:
    """Whether a search term can be sent as a parameter at all (PostgreSQL text has no NUL)."""
    return "\x00" not in term


def parse_ids(text: str) -> list[int]:
    """The ids a confirmation page pinned (``"3,5,8"``); a malformed list is refused."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    ids = {exact_id(part) for part in parts}
    if None in ids:
        raise PermissionDenied("malformed ids")
    return sorted(i for i in ids if i is not None)


def exact_id(term: str) -> int | None:
    """``term`` as a primary key, or None when it is not one (``"²"`` is a digit but no id)."""
    if term.isascii() and term.isdigit() and int(term) < 2**63:
        return int(term)
    return None


class EstimatedCountPaginator(Paginator):
    """Count exactly when the planner expects few rows; beyond that, show its estimate.

    count(*) reads every matching row: over a big history that is seconds per page view. Pages
    stop at ``MAX_PAGES``: a deeper page would read every row before it.
    """

    @cached_property
    def num_pages(self) -> int:
        return min(super().num_pages, MAX_PAGES)

    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        if isinstance(queryset, QuerySet):
            estimate = planner_rows(queryset)
            if estimate > EXACT_COUNT_MAX_ROWS:
                return estimate
        return super().count


def planner_rows(queryset: QuerySet[Any]) -> int:
    """The number of rows the planner expects ``queryset`` to return (nothing is read)."""
    try:
        select_sql, params = queryset.order_by().values("pk").query.sql_with_params()
    except EmptyResultSet:  # queryset.none(), a search that cannot match: no query to plan
        return 0
    with connections[queryset.db].cursor() as cursor:
        cursor.execute(sql.query("planner_rows").replace("{query}", select_sql), params)
        row = cursor.fetchone()
    assert row is not None
    plan = json.loads(row[0]) if isinstance(row[0], str) else row[0]
    return int(plan[0]["Plan"]["Plan Rows"])
