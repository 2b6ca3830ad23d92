"""The ``@job`` decorator, the handler registry, and payload version upgrades."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from .exceptions import InvalidJobOption

if TYPE_CHECKING:
    from .context import JobContext
    from .models import Job

HandlerFunc = Callable[["JobContext", Any], Any]
Upgrade = Callable[[Any], Any]

# Jobs enqueued through the django.tasks backend are named this prefix + the task's module path.
DJANGO_TASK_PREFIX = "django.tasks:"
_NAME = re.compile(r"^[A-Za-z_][\w.:-]{0,199}$")


class Handler:
    """A registered task: the function plus the options that govern its jobs."""

    def __init__(
        self,
        func: HandlerFunc,
        *,
        name: str,
        version: int = 1,
        queue: str | None = None,
        priority: int = 0,
        max_attempts: int | None = None,
        max_age: timedelta | None = None,
        lease: timedelta | None = None,
        heartbeat: bool = False,
        retry_on: Iterable[type[BaseException]] = (),
        permanent_on: Iterable[type[BaseException]] = (),
        redact: Iterable[str] = (),
    ) -> None:
        if not _NAME.match(name):
            raise InvalidJobOption(
                f"task name {name!r} must start with a letter or underscore and use only "
                "letters, digits and . _ : - (at most 200 characters)"
            )
        if not isinstance(version, int) or version < 1:
            raise InvalidJobOption(f"task {name!r}: version must be a whole number >= 1")
        if lease is not None and lease.total_seconds() < 1:
            raise InvalidJobOption(f"task {name!r}: lease must be at least one second")
        if heartbeat and lease is None:
            raise InvalidJobOption(
                f"task {name!r}: heartbeat=True needs an explicit lease= "
                "(heartbeats are for work that declares a longer lease)"
            )
        self.func = func
        self.name = name
        self.version = version
        self.queue = queue
        self.priority = priority
        self.max_attempts = max_attempts
        self.max_age = max_age
        self.lease = lease
        self.heartbeat = heartbeat
        self.retry_on = tuple(retry_on)
        self.permanent_on = tuple(permanent_on)
        self.redact = tuple(redact)
        self.upgrades: dict[int, Upgrade] = {}
        self.__doc__ = func.__doc__
        self.__name__ = getattr(func, "__name__", name)
        self.__module__ = getattr(func, "__module__", __name__)

    def __call__(self, ctx: JobContext, payload: Any) -> Any:
        return self.func(ctx, payload)

    def __repr__(self) -> str:
        return f"<Handler {self.name} v{self.version}>"

    def upgrade(self, from_version: int) -> Callable[[Upgrade], Upgrade]:
        """Register ``fn`` to turn a payload of ``from_version`` into ``from_version + 1``."""
        if not 1 <= from_version < self.version:
            raise InvalidJobOption(
                f"task {self.name!r}: an upgrade must start from a version below {self.version}"
            )

        def register(fn: Upgrade) -> Upgrade:
            self.upgrades[from_version] = fn
            return fn

        return register

    def enqueue(self, payload: Any, **options: Any) -> Job:
        """Enqueue a job for this handler in the caller's transaction."""
        from .enqueuing import enqueue

        return enqueue(self, payload, **options)


class Registry:
    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}

    def add(self, handler: Handler) -> None:
        existing = self._handlers.get(handler.name)
        if existing is not None and existing.func is not handler.func:
            qualname = f"{existing.__module__}.{existing.__name__}"
            raise InvalidJobOption(
                f"task name {handler.name!r} is already registered by {qualname}"
            )
        self._handlers[handler.name] = handler

    def get(self, name: str) -> Handler | None:
        handler = self._handlers.get(name)
        if handler is None and name.startswith(DJANGO_TASK_PREFIX):
            # A django.tasks function: the backend builds its handler on first use (importing
            # the function), and it is kept like any registered one.
            from .backend import resolve_handler

            handler = resolve_handler(name)
            if handler is not None:
                self._handlers[name] = handler
        return handler

    def names(self) -> list[str]:
        return sorted(self._handlers)

    def remove(self, name: str) -> None:
        self._handlers.pop(name, None)


registry = Registry()


def job(
    name: str | None = None, **options: Any
) -> Callable[[HandlerFunc], Handler]:
    """Register the decorated function as the handler of task ``name``.

    The function is called as ``fn(ctx, payload)``; ``options`` are those of ``Handler``.
    """

    def register(func: HandlerFunc) -> Handler:
        handler = Handler(func, name=name or f"{func.__module__}.{func.__qualname__}", **options)
        registry.add(handler)
        return handler

    return register


def upgrade_payload(handler: Handler, payload: Any, version: int) -> Any:
    """Bring ``payload`` from ``version`` up to the handler's version.

    Raises ``LookupError`` when a step is missing; the caller decides what that means.
    """
    while version < handler.version:
        step = handler.upgrades.get(version)
        if step is None:
            raise LookupError(
                f"task {handler.name!r} has no upgrade from payload version {version} "
                f"to {version + 1}"
            )
        payload = step(payload)
        version += 1
    return payload
