"""Per-key limits: what a handler declares, and the key each of its jobs gets.

``@job(limit=Limit(2, key=lambda p: p["customer"]))``: at most two jobs of one customer run at
once, whichever workers claim them. ``@job(limit=Rate(5, per=1))``: at most five start a second.
The limits are held by the database, not by this module (docs/limits.md): each key has slot
rows, a job is ``ready`` only while it holds one, and the statement that ends its run (for a
rate, the claim that starts it) gives the slot to the key's next ``throttled`` job. Here is only
the declaration and the key.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from .exceptions import InvalidJobOption, InvalidLimitKey, Snooze
from .validation import (
    DURATION_MAX_SECONDS,
    LIMIT_KEY_MAX_LENGTH,
    limit_key_problem,
    max_running_problem,
    number_problem,
    seconds_of,
    shown,
    task_name_problem,
)

# ``Limit(key=FAIRNESS_KEY)``: the job's fairness_key option is its key.
FAIRNESS_KEY = "fairness_key"
# ``Limit(key=QUEUE)``: the job's queue is its key (a cap per queue; handlers that share the
# limit's name share each queue's cap).
QUEUE = "queue"
_NAMED_KEYS = (FAIRNESS_KEY, QUEUE)


class _Keyed:
    """What a Limit and a Rate share: a job's key, ``name:key``, by their ``key`` rule."""

    key: Callable[[Any], str] | str | None
    name: str | None

    def key_of(self, task: str, payload: Any, fairness_key: str | None, queue: str) -> str:
        """The key of a job of ``task``: ``name:key``. Raise ``InvalidLimitKey``."""
        return _key_of(self.name or task, self.key, task, payload, fairness_key, queue)


@dataclass(frozen=True)
class Limit(_Keyed):
    """At most ``max_running`` jobs with one key run at once.

    ``key`` gives a job's key: a function of its payload that returns a string,
    ``"fairness_key"`` for the job's ``fairness_key`` option, ``"queue"`` for its queue, or
    None for one key for all of them (a global cap on the handler). Handlers whose limits share
    a ``name`` share its keys: ``Limit(5, name="payments")`` on two tasks lets five of them run
    at once, together. The name defaults to the task's.
    """

    max_running: int
    key: Callable[[Any], str] | str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        problem = max_running_problem(self.max_running)
        if problem is not None:
            raise InvalidJobOption(f"Limit max_running {problem}")
        _check_key_and_name("Limit", self.key, self.name)



@dataclass(frozen=True)
class Rate(_Keyed):
    """At most ``count`` jobs with one key start per ``per`` (seconds or a timedelta).

    Starts are spaced evenly, ``per / count`` apart (a generic cell rate algorithm: one time per
    key in the database). ``burst`` lets that many start at once after a quiet spell. A job may
    weigh more than one start: ``weight`` is a whole number, or a function of the payload that
    returns one, at most ``burst``. ``key`` and ``name`` are ``Limit``'s.
    """

    count: int
    per: float | timedelta | None = None
    burst: int = 1
    key: Callable[[Any], str] | str | None = None
    name: str | None = None
    weight: Callable[[Any], int] | int = 1

    def __post_init__(self) -> None:
        for field in ("count", "burst"):
            problem = max_running_problem(getattr(self, field))
            if problem is not None:
                raise InvalidJobOption(f"Rate {field} {problem}")
        if self.per is None:
            raise InvalidJobOption(
                "Rate needs its period: Rate(count, per=seconds or a timedelta)")
        problem = number_problem(self.per, 0, DURATION_MAX_SECONDS, low_inclusive=False)
        if problem is not None:
            raise InvalidJobOption(f"Rate per (its period, in seconds) {problem}")
        if not callable(self.weight):
            problem = _weight_problem(self.weight, self.burst)
            if problem is not None:
                raise InvalidJobOption(f"Rate weight {problem}")
        _check_key_and_name("Rate", self.key, self.name)

    @property
    def interval(self) -> float:
        """Seconds between starts of one unit of weight."""
        per = seconds_of(self.per)
        assert per is not None
        return per / self.count

    def weight_of(self, task: str, payload: Any) -> int:
        """How many starts a job of ``task`` weighs. Raise ``InvalidLimitKey``."""
        if not callable(self.weight):
            return self.weight
        try:
            weight = self.weight(payload)
        except Exception as exc:
            raise InvalidLimitKey(
                task, f"weight function raised {type(exc).__name__}: {shown(str(exc), 200)}",
                what="rate") from exc
        problem = _weight_problem(weight, self.burst)
        if problem is not None:
            raise InvalidLimitKey(task, f"weight function's answer {problem}", what="rate")
        return weight


def _weight_problem(weight: object, burst: int) -> str | None:
    problem = max_running_problem(weight)
    if problem is not None:
        return problem
    if weight > burst:  # type: ignore[operator]
        return (f"must be at most the burst ({burst}): a job that weighs more could never "
                f"start, got {weight}")
    return None


def _check_key_and_name(kind: str, key: object, name: str | None) -> None:
    if not (key is None or key in _NAMED_KEYS or callable(key)):
        raise InvalidJobOption(
            f"{kind} key must be a function of the payload, {FAIRNESS_KEY!r}, {QUEUE!r} or "
            f"None, got {shown(key)}")
    if name is not None:
        problem = task_name_problem(name)
        if problem is not None:
            raise InvalidJobOption(f"{kind} name {problem}")


def _key_of(name: str, key_rule: object, task: str, payload: Any,
            fairness_key: str | None, queue: str) -> str:
    """A job's whole key, ``name:key``, by its limit's ``key`` rule. Raise ``InvalidLimitKey``."""
    if key_rule is None:
        key: object = ""
    elif key_rule == FAIRNESS_KEY:
        if fairness_key is None:
            raise InvalidLimitKey(task, "is the job's fairness_key, and it has none: give "
                                        "fairness_key= when enqueueing")
        key = fairness_key
    elif key_rule == QUEUE:
        key = queue
    else:
        assert callable(key_rule)
        try:
            key = key_rule(payload)
        except Exception as exc:
            raise InvalidLimitKey(
                task, f"function raised {type(exc).__name__}: {shown(str(exc), 200)}"
            ) from exc
        if not isinstance(key, str):
            raise InvalidLimitKey(
                task, f"function must return a string, returned {type(key).__name__}")
    whole = f"{name}:{key}"
    problem = limit_key_problem(whole)
    if problem is not None:
        raise InvalidLimitKey(
            task, f"{shown(whole)} {problem}"
            + (f" (the name and ':' count: at most {LIMIT_KEY_MAX_LENGTH} in all)"
               if len(whole) > LIMIT_KEY_MAX_LENGTH else ""))
    return whole


class RateLimited(Snooze):
    """The service this handler calls said "too many" (an HTTP 429): no job of the rate key
    ``key`` starts for ``retry_after`` seconds, and this one runs again after them, without
    using an attempt (like ``Snooze``).

    ``key`` is a whole rate key, ``name:key`` as the admin shows it; None is the job's own.
    A key that is not a rate's is held back all the same, but only its jobs under a rate wait.
    """

    def __init__(self, key: str | None = None, retry_after: float | timedelta = 1.0) -> None:
        problem = number_problem(retry_after, 0, DURATION_MAX_SECONDS)
        if problem is not None:
            raise ValueError(f"RateLimited retry_after {problem}")
        if key is not None:
            problem = limit_key_problem(key)
            if problem is not None:
                raise ValueError(f"RateLimited key {problem}")
        seconds = (retry_after.total_seconds() if isinstance(retry_after, timedelta)
                   else float(retry_after))
        super().__init__(seconds)
        self.args = (f"rate limited for {seconds:g}s" + (f" ({key})" if key else ""),)
        self.key = key
        self.retry_after = seconds


__all__ = ["FAIRNESS_KEY", "QUEUE", "Limit", "Rate", "RateLimited"]
