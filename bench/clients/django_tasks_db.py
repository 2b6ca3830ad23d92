"""django-tasks-db (Django's database task backend): enqueue, preload, pickup."""

from __future__ import annotations

from typing import Any

from django.db import connection, transaction

from bench.clients.timing import AUTOCOMMIT, alternate, pickup_latencies
from bench.tasks import noop
from bench.tasks import pickup as pickup_task

TABLE = "django_tasks_database_dbtaskresult"


def reset() -> dict[str, Any]:
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {TABLE}")
    return {}


def enqueue_single(n: int, rounds: int = 4) -> dict[str, Any]:
    def one_each(first: int, count: int) -> None:
        for i in range(first, first + count):
            with transaction.atomic():
                noop.enqueue(i)

    def autocommit(first: int, count: int) -> None:
        for i in range(first, first + count):
            noop.enqueue(i)

    rates = alternate({"django-tasks-db": one_each, "django-tasks-db" + AUTOCOMMIT: autocommit},
                      n, rounds)
    reset()
    return rates


def preload(n: int, chunk: int = 1000) -> dict[str, Any]:
    # The backend has no bulk enqueue: one enqueue per task, many per transaction.
    for start in range(0, n, chunk):
        with transaction.atomic():
            for i in range(start, min(start + chunk, n)):
                noop.enqueue(i)
    return {"jobs": n}


def pickup(samples: int) -> dict[str, Any]:
    def probe(key: int, port: int) -> None:
        with transaction.atomic():
            pickup_task.enqueue(key, port)

    return pickup_latencies(probe, samples)
