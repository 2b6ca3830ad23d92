"""Exceptions: what enqueue refuses, and how handlers classify their failures."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured


class PgJobsError(Exception):
    """Base class of every django-pgjobs error."""


# --- enqueue refuses: nothing is written ----------------------------------------------------


class EnqueueError(PgJobsError, ValueError):
    """The job was refused before anything was written."""


class UnknownTask(EnqueueError):
    def __init__(self, task: str) -> None:
        super().__init__(
            f"unknown task {task!r}: no handler is registered under that name "
            "(register it with @django_pgjobs.job and make sure its module is imported)"
        )
        self.task = task


class UnknownQueue(EnqueueError):
    pass


class PayloadNotJSON(EnqueueError):
    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"not JSON at {path}: {reason}")
        self.path = path


class PayloadTooLarge(EnqueueError):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"payload is {size} bytes encoded, over the {limit}-byte limit "
            "(PGJOBS_MAX_PAYLOAD_BYTES); store the data elsewhere and enqueue a reference to it, "
            "such as a primary key or a storage path"
        )
        self.size = size
        self.limit = limit


class InvalidJobOption(EnqueueError):
    pass


class PayloadInvalid(EnqueueError):
    """A typed payload (``@job(payload=Model)``) does not match its model; ``path`` names the
    first field that does not (``payload.card.number``, ``payload.items[2]``)."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"invalid payload at {path}: {problem}")
        self.path = path
        self.problem = problem


class InvalidDependency(EnqueueError):
    """A workflow's edges are wrong: an unknown requirement, a job that is not in this call, not
    in this database or does not exist, one named twice, or more than PGJOBS_MAX_DEPENDENCIES."""


class DependencyCycle(InvalidDependency):
    """The jobs of one call depend on each other in a circle: none of them could ever start."""


class InvalidLimitKey(EnqueueError):
    """A handler's ``Limit`` or ``Rate`` could not give this job a key or a weight: its
    function raised, or gave something other than a short string (a whole number)."""

    def __init__(self, task: str, problem: str, *, what: str = "limit key") -> None:
        super().__init__(f"task {task!r}: the {what} {problem}")
        self.task = task


class NotMigrated(EnqueueError):
    """The database has no django-pgjobs tables, or not all of their columns, yet."""

    def __init__(self, alias: str) -> None:
        super().__init__(
            f"database {alias!r} has not been migrated for django-pgjobs (no pgjobs_job table, "
            f"or an older one): run manage.py migrate --database {alias}"
        )
        self.alias = alias


class InvalidSetting(PgJobsError, ImproperlyConfigured):
    """A PGJOBS_* setting its rule refuses, met by code that reads it (the checks were skipped).

    ``manage.py check`` reports the same value as pgjobs.E010. Raised before anything is sent.
    """

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(f"PGJOBS_{name} {problem} (manage.py check reports it as pgjobs.E010)")
        self.setting = f"PGJOBS_{name}"


class KeyTakenThenFreed(PgJobsError):
    """A unique key was held when the INSERT ran and free when its holder was read back.

    The holding job finished in between (or was pruned). Nothing was written; enqueueing again
    takes the key. Rare, and only with unique keys of jobs that finish within milliseconds.
    """

    def __init__(self, task: str, key: str) -> None:
        super().__init__(f"task {task!r}: the key {key!r} was held when this enqueue ran and "
                         "freed just after; enqueue again")
        self.task = task
        self.key = key


class EncryptionError(PgJobsError):
    """Encryption is not set up as a declaration needs, or a value cannot be opened."""


class EncryptionNotConfigured(EncryptionError, EnqueueError):
    """A declared field must be encrypted and ``PGJOBS_ENCRYPTION_KEYS`` holds no usable key."""


class EncryptedPathMissing(EnqueueError):
    """A declared encrypted path names a field the payload (result, receipt) does not have."""

    def __init__(self, root: str, path: str) -> None:
        super().__init__(f"{root}: the encrypted path {path!r} names no value of it (the path "
                         "must exist; give it a null to encrypt nothing)")
        self.path = path


class Undecryptable(EncryptionError):
    """An envelope did not open: its key is no longer configured, or it was altered or moved."""

    def __init__(self, where: str, path: str, key_id: str, reason: str, *,
                 key_missing: bool = False) -> None:
        super().__init__(f"the encrypted {where} field {path} (key {key_id}) cannot be "
                         f"decrypted: {reason}")
        self.path = path
        self.key_id = key_id
        # The key is not configured here (a worker deployed without it), rather than the value
        # being altered or moved: another worker, or this one redeployed, may open it.
        self.key_missing = key_missing


# --- handlers raise these to say what kind of failure happened ------------------------------


class RotationStalled(EncryptionError):
    """pgjobs_rotate_keys found rows of a window changed each time it read them, too often in a
    row to go on (writers that rewrite the same rows without pause); running it again resumes."""


class HandlerSignal(PgJobsError):
    """A handler's statement about its outcome."""


class Permanent(HandlerSignal):
    """Retrying cannot help (bad input, missing permission, gone for good): dead at once."""


class Transient(HandlerSignal):
    """A passing failure (network, timeout, overload): retry with backoff."""


class RetryAfter(Transient):
    """Rate limited: retry no sooner than ``seconds`` from now."""

    def __init__(self, seconds: float, message: str = "") -> None:
        if seconds < 0:
            raise ValueError("RetryAfter seconds must be >= 0")
        super().__init__(message or f"retry after {seconds:g}s")
        self.seconds = float(seconds)


class Snooze(HandlerSignal):
    """Not now: run again after ``seconds`` without using an attempt.

    Bounded by PGJOBS_MAX_SNOOZES and the job's deadline.
    """

    def __init__(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("Snooze seconds must be >= 0")
        super().__init__(f"snoozed for {seconds:g}s")
        self.seconds = float(seconds)


class LeaseLost(PgJobsError):
    """This worker no longer owns the job: another attempt or an operator took it over."""


class TimedOut(LeaseLost):
    """The job ran past its timeout: its worker has settled it as timed out.

    ``ctx.heartbeat()`` raises it from then on. A handler that lists it in ``permanent_on``
    makes its timeouts permanent (dead at once) instead of retried.
    """


class Cancelled(LeaseLost):
    """An operator cancelled the running job: its worker has settled it as cancelled."""
