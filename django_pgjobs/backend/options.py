"""The backend's OPTIONS and queue names: what is accepted, said as check messages."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS
from django.utils.module_loading import import_string

from ..conf import settings
from ..exceptions import InvalidJobOption
from ..validation import (
    DURATION_SPANS,
    OPTION_RULES,
    number_problem,
    queue_problem,
    shown,
)
from .compat import InvalidTask

# OPTIONS keys that set the job options of every task the backend enqueues; OPTIONS["queues"]
# maps a queue name to the same keys for that queue only.
JOB_OPTIONS = ("max_attempts", "lease_seconds", "max_age_seconds", "timeout_seconds")
# ``max_attempts`` and ``backoff`` are the names of Django's open proposal for task retries
# (django/new-features#142): backoff(exception, task_result) returns seconds, or None to stop.
BACKEND_OPTIONS = (*JOB_OPTIONS, "backoff", "database", "heartbeat", "queues")


def _seconds(option: str) -> Callable[[Any], str | None]:
    """A ``*_seconds`` key: a number, in the span of the enqueue option it sets."""
    low, high, low_inclusive = DURATION_SPANS[option]
    return lambda v: number_problem(v, low, high, low_inclusive=low_inclusive)


# Each key under the rule of the enqueue option it sets (validation.OPTION_RULES).
JOB_OPTION_RULES: dict[str, Callable[[Any], str | None]] = {
    "max_attempts": OPTION_RULES["max_attempts"],
    "lease_seconds": _seconds("lease"),
    "max_age_seconds": _seconds("max_age"),
    # Django's task API has no timeout yet; when it gains one, it maps onto the same option.
    "timeout_seconds": _seconds("timeout"),
}


class InvalidTaskOption(InvalidTask, InvalidJobOption):
    """A task refused by django-pgjobs' rules: Django's ``InvalidTask`` and our ``EnqueueError``."""


def pgjobs_options(backend: object) -> dict[str, Any]:
    """``backend``'s OPTIONS if it is a PgJobsBackend (others' OPTIONS mean other things)."""
    if getattr(backend, "is_pgjobs_backend", False):
        return dict(getattr(backend, "options", {}))
    return {}


def job_options(options: dict[str, Any], queue: str) -> dict[str, Any]:
    """The enqueue options ``options`` (a backend's OPTIONS) give tasks of ``queue``."""
    merged = {k: options[k] for k in JOB_OPTIONS if k in options}
    merged.update(dict(options.get("queues", {})).get(queue, {}))
    result: dict[str, Any] = {}
    if "max_attempts" in merged:
        result["max_attempts"] = merged["max_attempts"]
    if "lease_seconds" in merged:
        result["lease"] = timedelta(seconds=merged["lease_seconds"])
    if "max_age_seconds" in merged:
        result["max_age"] = timedelta(seconds=merged["max_age_seconds"])
    if "timeout_seconds" in merged:
        result["timeout"] = timedelta(seconds=merged["timeout_seconds"])
    return result


Backoff = Callable[[BaseException, Any], "float | int | None"]


def backoff_of(options: dict[str, Any]) -> Backoff | None:
    """OPTIONS["backoff"]: the callable, imported when given by its dotted path (or None)."""
    value = options.get("backoff")
    if isinstance(value, str):
        try:
            value = import_string(value)
        except ImportError:
            return None  # the system check says so (pgjobs.E103)
    return value if callable(value) else None


def _backoff_problem(value: Any) -> str | None:
    if isinstance(value, str):
        try:
            value = import_string(value)
        except ImportError as exc:
            return f"cannot be imported ({exc})"
    if not callable(value):
        return (f"must be a callable backoff(exception, task_result) or its dotted path, got "
                f"{shown(value)}")
    return None


def option_problems(options: dict[str, Any]) -> list[str]:
    """What is wrong with a PgJobsBackend OPTIONS dict, one sentence each."""
    problems = [f"OPTIONS has an unknown key {key!r} (known: {', '.join(BACKEND_OPTIONS)})."
                for key in options if key not in BACKEND_OPTIONS]
    if not isinstance(options.get("heartbeat", False), bool):
        problems.append("OPTIONS['heartbeat'] must be True or False.")
    if not isinstance(options.get("database", DEFAULT_DB_ALIAS), str):
        problems.append("OPTIONS['database'] must be a database alias.")
    if options.get("backoff") is not None:
        problem = _backoff_problem(options["backoff"])
        if problem is not None:
            problems.append(f"OPTIONS['backoff'] {problem}.")
    queues = options.get("queues", {})
    if not isinstance(queues, dict):
        return [*problems, "OPTIONS['queues'] must map queue names to options."]
    for where, values in [("OPTIONS", options), *((f"OPTIONS['queues'][{q!r}]", v)
                                                   for q, v in queues.items())]:
        if not isinstance(values, dict):
            problems.append(f"{where} must be a dict.")
            continue
        if values is not options:
            problems += [f"{where} has an unknown key {key!r} (known: {', '.join(JOB_OPTIONS)})."
                         for key in values if key not in JOB_OPTIONS]
        for key, rule in JOB_OPTION_RULES.items():
            value = values.get(key)
            problem = None if value is None else rule(value)
            if problem is not None:
                problems.append(f"{where}[{key!r}] {problem}.")
    return problems


def task_queue_problem(queue: str) -> str | None:
    problem = queue_problem(queue)
    if problem is not None:
        return f"Queue {queue!r} is not valid for backend: the queue {problem}."
    declared = settings.QUEUES
    if declared is not None and queue not in declared:
        return f"Queue {queue!r} is not valid for backend: PGJOBS_QUEUES does not declare it."
    return None
