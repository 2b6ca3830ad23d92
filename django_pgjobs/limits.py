"""Per-key concurrency limits: what a handler declares, and the key each of its jobs gets.

``@job(limit=Limit(2, key=lambda p: p["customer"]))``: at most two jobs of one customer run at
once, whichever workers claim them. The limit is held by the database, not by this module
(docs/limits.md): each key has ``max_running`` slot rows, a job is ``ready`` only while it holds
one, and the statement that ends its run frees the slot and gives it to the key's next
``throttled`` job. Here is only the declaration and the key.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .exceptions import InvalidJobOption, InvalidLimitKey
from .validation import (
    LIMIT_KEY_MAX_LENGTH,
    limit_key_problem,
    max_running_problem,
    shown,
    task_name_problem,
)

# ``Limit(key=FAIRNESS_KEY)``: the job's fairness_key option is its key.
FAIRNESS_KEY = "fairness_key"


@dataclass(frozen=True)
class Limit:
    """At most ``max_running`` jobs with one key run at once.

    ``key`` gives a job's key: a function of its payload that returns a string,
    ``"fairness_key"`` for the job's ``fairness_key`` option, or None for one key for all of
    them (a global cap on the handler). Handlers whose limits share a ``name`` share its keys:
    ``Limit(5, name="payments")`` on two tasks lets five of them run at once, together. The name
    defaults to the task's.
    """

    max_running: int
    key: Callable[[Any], str] | str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        problem = max_running_problem(self.max_running)
        if problem is not None:
            raise InvalidJobOption(f"Limit max_running {problem}")
        if not (self.key is None or self.key == FAIRNESS_KEY or callable(self.key)):
            raise InvalidJobOption(
                f"Limit key must be a function of the payload, {FAIRNESS_KEY!r} or None, "
                f"got {shown(self.key)}")
        if self.name is not None:
            problem = task_name_problem(self.name)
            if problem is not None:
                raise InvalidJobOption(f"Limit name {problem}")

    def key_of(self, task: str, payload: Any, fairness_key: str | None) -> str:
        """The limit key of a job of ``task``: ``name:key``. Raise ``InvalidLimitKey``."""
        name = self.name or task
        if self.key is None:
            key: object = ""
        elif self.key == FAIRNESS_KEY:
            if fairness_key is None:
                raise InvalidLimitKey(task, "is the job's fairness_key, and it has none: give "
                                            "fairness_key= when enqueueing")
            key = fairness_key
        else:
            assert callable(self.key)
            try:
                key = self.key(payload)
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


__all__ = ["FAIRNESS_KEY", "Limit"]
