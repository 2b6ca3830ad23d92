"""django-tasks-db tasks for the benchmark: the same no-op and pickup probe."""

from __future__ import annotations

from .probe import report_start

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task  # type: ignore[no-redef]


@task()
def noop(n: int) -> None:
    """Do nothing."""


@task()
def pickup(n: int, port: int) -> None:
    """Report the moment this task started."""
    report_start(n, port)
