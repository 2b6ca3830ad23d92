"""A django.tasks function: enqueued with .enqueue(), run by pgjobs_worker like any job."""

from __future__ import annotations

try:
    from django.tasks import task
except ImportError:  # Django < 6: the django-tasks backport
    from django_tasks import task


@task(queue_name="default")
def add(a: int, b: int) -> int:
    """Add two numbers (the smallest task that proves arguments and results travel)."""
    return a + b
