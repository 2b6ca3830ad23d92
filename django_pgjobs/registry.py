"""The ``@job`` decorator, the handler registry, and payload version upgrades."""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from . import encryption
from .conf import settings
from .exceptions import InvalidJobOption, PayloadInvalid, Undecryptable
from .limits import Limit, Rate
from .redaction import Redactor, compile_path
from .ticks import Schedule
from .validation import OPTION_RULES, missing_extra, queue_problem, task_name_problem

if TYPE_CHECKING:
    from .context import JobContext
    from .models import Job
    from .typed import PayloadType

HandlerFunc = Callable[["JobContext", Any], Any]
Upgrade = Callable[[Any], Any]

# Where a handler runs: a thread of the worker, or a child process the worker can kill.
ISOLATIONS = ("thread", "process")
# Jobs enqueued through the django.tasks backend are named this prefix + the task's module path.
DJANGO_TASK_PREFIX = "django.tasks:"


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
        timeout: timedelta | float | None = None,
        isolation: str = "thread",
        retry_on: Iterable[type[BaseException]] = (),
        permanent_on: Iterable[type[BaseException]] = (),
        redact: Iterable[str] = (),
        cron: str | None = None,
        timezone: str | None = None,
        schedules: Iterable[Schedule] = (),
        limit: Limit | Rate | None = None,
        payload: type | None = None,
        encrypted: Iterable[str] = (),
        encrypted_result: Iterable[str] = (),
    ) -> None:
        problem = task_name_problem(name)
        if problem is not None:
            raise InvalidJobOption(f"task name {problem}")
        # The handler's defaults obey the rules every enqueue checks (validation.OPTION_RULES):
        # a default no enqueue would accept fails here, at import.
        for declared, option, value in (
            ("version", "payload_version", version), ("priority", "priority", priority),
            ("max_attempts", "max_attempts", max_attempts), ("max_age", "max_age", max_age),
            ("lease", "lease", lease), ("timeout", "timeout", timeout),
        ):
            problem = None if value is None else OPTION_RULES[option](value)
            if problem is not None:
                raise InvalidJobOption(f"task {name!r}: {declared} {problem}")
        if queue is not None:
            problem = queue_problem(queue)
            if problem is not None:
                raise InvalidJobOption(f"task {name!r}: queue {problem}")
        if heartbeat and lease is None:
            raise InvalidJobOption(
                f"task {name!r}: heartbeat=True needs an explicit lease= "
                "(heartbeats are for work that declares a longer lease)"
            )
        if limit is not None and not isinstance(limit, Limit | Rate):
            raise InvalidJobOption(
                f"task {name!r}: limit must be a django_pgjobs.Limit(max_running, key=...) or "
                f"Rate(count, per, ...), got {type(limit).__name__}")
        if isolation not in ISOLATIONS:
            raise InvalidJobOption(
                f"task {name!r}: isolation must be one of {', '.join(ISOLATIONS)}, "
                f"got {isolation!r}"
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
        self.timeout = timeout
        # "process": the handler runs in a child process, which the worker kills at the timeout
        # or a cancel; a thread cannot be killed.
        self.isolation = isolation
        # At most limit.max_running jobs of one limit key run at once, or start at most
        # limit.count per limit.per (docs/limits.md).
        self.limit = limit
        # An async def handler runs on the worker's event loop, many at once.
        self.is_async = inspect.iscoroutinefunction(func)
        if self.is_async and isolation == "process":
            raise InvalidJobOption(
                f"task {name!r}: an async handler runs on the worker's event loop; "
                "isolation='process' is for blocking code"
            )
        self.retry_on = tuple(retry_on)
        self.permanent_on = tuple(permanent_on)
        self.redact = tuple(redact)
        for path in self.redact:
            try:
                compile_path(path)
            except ValueError as exc:
                raise InvalidJobOption(f"task {name!r}: {exc}") from None
        # The model its payloads are (docs/payloads.md): enqueue stores its JSON form, the
        # handler receives an instance.
        self.payload_type = None if payload is None else _payload_type(payload, name)
        # Paths of the payload and of the result stored encrypted (docs/security.md).
        self.encrypted = _encrypted_paths(name, encrypted, "encrypted")
        self.encrypted_result = _encrypted_paths(name, encrypted_result, "encrypted_result")
        # Whether enqueue does more to a payload than check that it is JSON.
        self.shapes_payload = self.payload_type is not None or bool(self.encrypted)
        self.schedules = _declared_schedules(name, cron, timezone, schedules)
        # Paths that depend on the payload itself; see Redactor.paths_for.
        self.redact_paths_for: Callable[[Any, tuple[str, ...]], Iterable[str]] | None = None
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
        return registry.enqueuer(self, payload, **options)

    def plain_payload(self, payload: Any, version: int) -> Any:
        """``payload`` checked against the handler's model, in the JSON form rows hold.

        A payload of an older version is kept as given; it is checked once the upgrades have
        brought it to this version, as a worker will see it.
        """
        if self.payload_type is None:
            return payload
        if version == self.version:
            return self.payload_type.dump(payload)
        try:
            upgraded = upgrade_payload(self, payload, version)
        except Exception as exc:  # the upgrade is the handler's code; nothing is sent
            raise PayloadInvalid("payload", f"the upgrade from version {version} failed: "
                                 f"{type(exc).__name__}: {exc}") from exc
        self.payload_type.dump(upgraded)
        return payload

    def sealed(self, plain: Any, *, stored: bool = False) -> Any:
        """A copy of ``plain`` with the declared fields encrypted (``encryption.seal``);
        ``stored``: a row's payload (a replay's), whose encrypted fields stay as they are."""
        if not self.encrypted:
            return plain
        return encryption.seal(plain, self.encrypted, where=encryption.PAYLOAD, owner=self.name,
                               keep_sealed=stored)

    def readable_payload(self, stored: Any) -> Any:
        """``stored`` with its encrypted fields decrypted where they open: to scrub their
        plaintext out of text a handler wrote, or to compare with what a test enqueued. As
        stored where they do not (then no plaintext was handled)."""
        if not self.encrypted:
            return stored
        try:
            return encryption.opened(stored, self.encrypted, where=encryption.PAYLOAD,
                                     owner=self.name)
        except Undecryptable:
            return stored

    def payload_for_handler(self, stored: Any, version: int) -> Any:
        """What the handler is called with: ``stored`` decrypted, upgraded and typed."""
        payload = encryption.opened(stored, self.encrypted, where=encryption.PAYLOAD,
                                    owner=self.name)
        payload = upgrade_payload(self, payload, version)
        if self.payload_type is not None:
            payload = self.payload_type.load(payload)
        return payload


def _payload_type(declared: object, task: str) -> PayloadType:
    # Imported by the handlers that declare one: a worker whose handlers declare none starts
    # without it.
    from .typed import PayloadType

    return PayloadType.of(declared, task)


def _encrypted_paths(task: str, paths: Iterable[str], option: str) -> tuple[str, ...]:
    try:
        declared = encryption.checked_paths(paths, f"task {task!r}: {option}")
    except ValueError as exc:
        raise InvalidJobOption(str(exc)) from None
    if declared and importlib.util.find_spec("cryptography") is None:
        raise InvalidJobOption(
            f"task {task!r}: {option}= encrypts with "
            f"{missing_extra('cryptography', 'encryption')}")
    return declared


def _declared_schedules(
    task: str, cron: str | None, timezone: str | None, schedules: Iterable[Schedule]
) -> tuple[Schedule, ...]:
    """The handler's schedules, bound to its task: ``cron=`` is one named after the task."""
    if isinstance(schedules, Schedule | str) or not isinstance(schedules, Iterable):
        raise InvalidJobOption(f"task {task!r}: schedules must be a list of Schedule(...)")
    declared = list(schedules)
    for item in declared:
        if not isinstance(item, Schedule):
            raise InvalidJobOption(
                f"task {task!r}: schedules must be a list of Schedule(...), got "
                f"{type(item).__name__}"
            )
    if cron is not None:
        try:
            declared.insert(0, Schedule(cron, name=task, timezone=timezone or "UTC"))
        except InvalidJobOption as exc:
            raise InvalidJobOption(f"task {task!r}: {exc}") from None
    elif timezone is not None:
        raise InvalidJobOption(f"task {task!r}: timezone= goes with cron=")
    bound = [schedule.bound(task) for schedule in declared]
    names = [schedule.name for schedule in bound]
    for name in names:
        if names.count(name) > 1:
            raise InvalidJobOption(
                f"task {task!r} declares two schedules named {name!r}: give each its own "
                "Schedule(name=...)"
            )
    for schedule in bound:
        problem = schedule.problem()
        if problem is not None:
            raise InvalidJobOption(f"task {task!r}: {problem}")
    return tuple(bound)


Resolver = Callable[[str, bool], "Handler | None"]
Enqueuer = Callable[..., "Job"]


def _not_ready(*args: Any, **kwargs: Any) -> Job:
    raise RuntimeError(
        "django_pgjobs is not ready: add it to INSTALLED_APPS, and enqueue only after Django "
        "has loaded its apps"
    )


class Registry:
    """The handlers of this process, by task name.

    ``get`` answers from what is registered and never imports anything. ``resolve`` also asks
    the resolvers that integrations add for names of their own (the django.tasks backend
    resolves ``django.tasks:<module path>``); only a worker, which must run whatever was
    enqueued, and the admin, which must redact it, let a resolver import a module.
    """

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}
        self._resolvers: dict[str, Resolver] = {}
        # What Handler.enqueue calls. The app sets it to enqueuing.enqueue when Django has
        # loaded its apps: handlers are declared before the models they enqueue into exist.
        self.enqueuer: Enqueuer = _not_ready

    def add(self, handler: Handler) -> None:
        existing = self._handlers.get(handler.name)
        if existing is not None and existing.func is not handler.func:
            qualname = f"{existing.__module__}.{existing.__name__}"
            raise InvalidJobOption(
                f"task name {handler.name!r} is already registered by {qualname}"
            )
        for schedule in handler.schedules:
            owner = self._schedule_owner(str(schedule.name))
            if owner is not None and owner != handler.name:
                raise InvalidJobOption(
                    f"schedule {schedule.name!r} of task {handler.name!r} is already declared "
                    f"by task {owner!r}: schedule names are unique"
                )
        if handler.limit is not None:
            name = handler.limit.name or handler.name
            for other in self._handlers.values():
                if (other.name != handler.name and other.limit is not None
                        and (other.limit.name or other.name) == name
                        and type(other.limit) is not type(handler.limit)):
                    raise InvalidJobOption(
                        f"task {handler.name!r}: its {type(handler.limit).__name__} is named "
                        f"{name!r}, which task {other.name!r} names its "
                        f"{type(other.limit).__name__}: a name's keys are one kind of limit")
        self._handlers[handler.name] = handler

    def rate_of(self, key: str) -> Rate | None:
        """The ``Rate`` whose key limit key ``key`` (``name:key``) is, by the handlers here."""
        # A name may hold ':' itself: the longest declared name the key starts with is its.
        named = {(h.limit.name or h.name): h.limit for h in self._handlers.values()
                 if h.limit is not None}
        found = max((name for name in named if key.startswith(f"{name}:")), key=len,
                    default=None)
        limit = None if found is None else named[found]
        return limit if isinstance(limit, Rate) else None

    def _schedule_owner(self, name: str) -> str | None:
        for handler in self._handlers.values():
            if any(schedule.name == name for schedule in handler.schedules):
                return handler.name
        return None

    def schedules(self) -> list[Schedule]:
        """Every schedule the registered handlers declare, by name."""
        declared = [s for h in self._handlers.values() for s in h.schedules]
        return sorted(declared, key=lambda schedule: str(schedule.name))

    def add_resolver(self, prefix: str, resolver: Resolver) -> None:
        """Let ``resolver(name, may_import)`` build the handlers of names under ``prefix``."""
        self._resolvers[prefix] = resolver

    def get(self, name: str) -> Handler | None:
        """The handler registered under ``name``; nothing is imported."""
        return self._handlers.get(name)

    def resolve(self, name: str, *, may_import: bool = True) -> Handler | None:
        """The handler for ``name``, built by a resolver if none is registered (and kept)."""
        handler = self._handlers.get(name)
        if handler is not None:
            return handler
        for prefix, resolver in self._resolvers.items():
            if name.startswith(prefix):
                handler = resolver(name, may_import)
                if handler is not None:
                    self._handlers.setdefault(name, handler)
                    return self._handlers[name]
        return None

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
    ``cron="0 6 * * *", timezone="Europe/Paris"`` declares a schedule named after the task;
    ``schedules=[Schedule(...), ...]`` declares several, each with its own name and payload.
    """

    def register(func: HandlerFunc) -> Handler:
        handler = Handler(func, name=name or f"{func.__module__}.{func.__qualname__}", **options)
        registry.add(handler)
        return handler

    return register


def redactor_for(task: str | None = None) -> Redactor:
    """The redactor for ``task``: the configured keys plus the paths its handler declares.

    Encrypted paths are hidden too: a value decrypted for its handler is as secret as its
    ciphertext, and an error that quotes it is scrubbed of it.
    """
    handler = registry.resolve(task) if task else None
    keys = tuple(settings.REDACT_KEYS)
    if handler is None:
        return Redactor(keys)
    return Redactor(keys, (*handler.redact, *handler.encrypted, *handler.encrypted_result),
                    handler.redact_paths_for)


def redact(*paths: str) -> Callable[[Any], Any]:
    """Declare redaction paths on a function that is not a ``@job`` handler (a ``@task``).

    Put it under ``@task``. A path's first segment names a parameter: ``@redact("card.number")``
    hides ``card["number"]`` whether ``card`` is passed by keyword or by position.
    """
    for path in paths:
        try:
            compile_path(path)
        except ValueError as exc:
            raise InvalidJobOption(str(exc)) from None

    def declare(func: Any) -> Any:
        func.pgjobs_redact = (*getattr(func, "pgjobs_redact", ()), *paths)
        return func

    return declare


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
