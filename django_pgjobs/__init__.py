"""django-pgjobs: a durable PostgreSQL job queue for Django.

The public API. Nothing here imports models at import time, so it is safe to import from
settings-adjacent code and from handler modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .exceptions import (
    Cancelled,
    DependencyCycle,
    EncryptedPathMissing,
    EncryptionError,
    EncryptionNotConfigured,
    EnqueueError,
    InvalidDependency,
    InvalidJobOption,
    InvalidLimitKey,
    LeaseLost,
    PayloadInvalid,
    PayloadNotJSON,
    PayloadTooLarge,
    Permanent,
    PgJobsError,
    RetryAfter,
    Snooze,
    TimedOut,
    Transient,
    Undecryptable,
    UnknownQueue,
    UnknownTask,
)
from .limits import Limit, Rate, RateLimited
from .registry import Handler, job, redact
from .ticks import Schedule

if TYPE_CHECKING:
    from .enqueuing import JobSpec
    from .models import Job
    from .workflows import After, chain, chord, group

__all__ = [
    "After",
    "Cancelled",
    "DependencyCycle",
    "EncryptedPathMissing",
    "EncryptionError",
    "EncryptionNotConfigured",
    "EnqueueError",
    "Handler",
    "InvalidDependency",
    "InvalidJobOption",
    "InvalidLimitKey",
    "JobSpec",
    "LeaseLost",
    "Limit",
    "PayloadInvalid",
    "PayloadNotJSON",
    "PayloadTooLarge",
    "Permanent",
    "PgJobsError",
    "Rate",
    "RateLimited",
    "RetryAfter",
    "Schedule",
    "Snooze",
    "TimedOut",
    "Transient",
    "Undecryptable",
    "UnknownQueue",
    "UnknownTask",
    "chain",
    "chord",
    "enqueue",
    "enqueue_many",
    "group",
    "job",
    "redact",
]


def enqueue(task: str | Handler, payload: Any, **options: Any) -> Job:
    """Enqueue one job in the caller's transaction; see ``django_pgjobs.enqueuing.enqueue``."""
    return _enqueuing().enqueue(task, payload, **options)


def enqueue_many(specs: Any, *, using: str | None = None) -> list[Job]:
    """Enqueue many ``JobSpec``s with one INSERT; see ``django_pgjobs.enqueuing.enqueue_many``."""
    return _enqueuing().enqueue_many(specs, using=using)


_imported: list[Any] = []


def _enqueuing() -> Any:
    """``django_pgjobs.enqueuing``, imported at the first enqueue (it needs the app registry)
    and kept: an ``import`` statement in ``enqueue`` itself ran again at every call."""
    if not _imported:
        from . import enqueuing

        _imported.append(enqueuing)
    return _imported[0]


_WORKFLOW_NAMES = frozenset({"After", "chain", "chord", "group"})


def __getattr__(name: str) -> Any:
    if name == "JobSpec":
        from .enqueuing import JobSpec

        return JobSpec
    if name in _WORKFLOW_NAMES:
        from . import workflows

        return getattr(workflows, name)
    raise AttributeError(name)
