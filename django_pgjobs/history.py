"""The queues' history: a sample of each queue per interval, for the admin's charts.

Every worker runs the ``history`` step (``PGJOBS_HISTORY_INTERVAL_SECONDS``, twice per interval
so no interval is missed for jitter); the first to run in an interval writes one row per queue
with anything to count (``pgjobs_queue_sample``), in one statement that also deletes samples past
``PGJOBS_HISTORY_RETENTION_SECONDS``; the others find the interval sampled and read nothing more.
The rows outlive the jobs they counted: pruning finished jobs leaves the history whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import DEFAULT_DB_ALIAS, connections

from . import sql
from .conf import settings

# The spans the charts offer: (name, seconds, bucket seconds): 60 points for the hour, 96 of a
# quarter hour for the day, 168 of an hour for the week.
RANGES = {
    "1h": (3600, 60),
    "24h": (24 * 3600, 900),
    "7d": (7 * 24 * 3600, 3600),
}
DEFAULT_RANGE = "1h"
# Samples and chart buckets sit on one grid, counted from this instant (date_bin's origin).
BIN_ORIGIN = datetime(2000, 1, 1, tzinfo=UTC)


def sample_queues(using: str = DEFAULT_DB_ALIAS) -> int:
    """Write this interval's sample unless another worker has; return the rows written."""
    with connections[using].cursor() as cursor:
        statement = sql.query("sample_queues").replace(
            "{oldest_ready}", sql.query("stats_oldest_ready"))
        cursor.execute(statement, {
            "interval": float(settings.HISTORY_INTERVAL_SECONDS),
            "retention": float(settings.HISTORY_RETENTION_SECONDS), "origin": BIN_ORIGIN,
        })
        return max(cursor.rowcount, 0)


@dataclass(frozen=True)
class Point:
    """One bucket of one queue's history (or of every queue's, summed, when ``queue`` is None)."""

    at: datetime
    queue: str | None
    ready: int
    waiting: int
    running: int
    oldest_ready_seconds: float | None
    succeeded: int
    failed: int
    dead: int


def bucket_seconds(range_name: str) -> int:
    """The width of one point of ``range_name``'s chart: never finer than the samples."""
    return max(RANGES[range_name][1], int(float(settings.HISTORY_INTERVAL_SECONDS)))


def points(range_name: str, using: str = DEFAULT_DB_ALIAS) -> dict[str, list[Point]]:
    """Each queue's buckets over ``range_name`` (a key of ``RANGES``), oldest first."""
    span, bucket = RANGES[range_name][0], bucket_seconds(range_name)
    with connections[using].cursor() as cursor:
        cursor.execute(sql.query("history_points"),
                       {"span": span, "bucket": bucket, "origin": BIN_ORIGIN})
        rows = cursor.fetchall()
    series: dict[str, list[Point]] = {}
    for at, queue, ready, waiting, running, oldest, succeeded, failed, dead in rows:
        series.setdefault(queue, []).append(
            Point(at, queue, ready, waiting, running, oldest, succeeded, failed, dead))
    return series


__all__ = ["BIN_ORIGIN", "DEFAULT_RANGE", "RANGES", "Point", "bucket_seconds", "points",
           "sample_queues"]
