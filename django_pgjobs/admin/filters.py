"""List filters on names the code knows (queues, tasks), never a scan of the table."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from .. import sql
from ..conf import settings
from ..registry import registry
from ..status import TERMINAL_STATUSES
from .display import searchable


class KnownNamesFilter(admin.SimpleListFilter):
    """Filter on a name column, offering the names the code knows (plus the one chosen).

    Known names, not SELECT DISTINCT: that would read every row of a big table.
    """

    field = ""  # the column filtered on; the query parameter's name when empty

    def known_names(self) -> set[str]:
        raise NotImplementedError

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = self.known_names()
        if self.value():
            names.add(str(self.value()))
        return [(n, n) for n in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if not value:
            return queryset
        if not searchable(str(value)):
            return queryset.none()
        return queryset.filter(**{self.field or str(self.parameter_name): value})


class QueueFilter(KnownNamesFilter):
    title = "queue"
    parameter_name = "queue"

    def known_names(self) -> set[str]:
        with connection.cursor() as cursor:
            cursor.execute(sql.query("filter_queues"))
            names = {row[0] for row in cursor.fetchall()}
        if settings.QUEUES is not None:
            return names | set(settings.QUEUES)
        return names | {settings.QUEUE} | {
            h.queue for h in map(registry.get, registry.names()) if h and h.queue}


class TaskFilter(KnownNamesFilter):
    title = "task"
    parameter_name = "task"
    # Many tasks: the list gets a box that narrows it as the operator types.
    template = "admin/pgjobs/filter_with_search.html"

    @staticmethod
    def names() -> set[str]:
        return set(registry.names())

    def known_names(self) -> set[str]:
        return self.names()


class ScheduleFilter(admin.SimpleListFilter):
    """The jobs one schedule made (``?schedule=<id>``, linked from the schedule's pages); shown
    only while chosen, since a list of every schedule would say little."""

    title = "schedule"
    parameter_name = "schedule"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        value = self.value()
        return [(str(value), f"#{value}")] if value and str(value).isdigit() else []

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if not value:
            return queryset
        if not str(value).isdigit() or len(str(value)) > 18:
            return queryset.none()
        return queryset.filter(schedule_id=int(str(value)))


class WorkflowFilter(admin.SimpleListFilter):
    """The jobs of one workflow (``?workflow=<uuid>``, linked from a job's page); shown only
    while chosen, like the schedule filter."""

    title = "workflow"
    parameter_name = "workflow"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        value = _uuid(self.value())
        return [(str(value), str(value)[:8])] if value else []

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if not self.value():
            return queryset
        value = _uuid(self.value())
        return queryset.none() if value is None else queryset.filter(workflow_id=value)


def _uuid(value: Any) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value)) if value else None
    except ValueError:
        return None


# The time filters' ranges: (query value, label, seconds back).
SINCE_RANGES = (("1h", "in the last hour", 3600), ("24h", "in the last 24 hours", 86400),
                ("7d", "in the last 7 days", 7 * 86400), ("30d", "in the last 30 days",
                                                          30 * 86400))


class SinceFilter(admin.SimpleListFilter):
    """Rows whose ``field`` falls within a recent time range; read newest first along the
    primary key, where recent rows are, or along an index the subclass's ``scope`` names."""

    field = ""

    def scope(self) -> dict[str, Any]:
        return {}

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(value, label) for value, label, _ in SINCE_RANGES]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() is None:
            return queryset
        seconds = {value: back for value, _, back in SINCE_RANGES}.get(str(self.value()))
        if seconds is None:
            return queryset.none()
        since = timezone.now() - timedelta(seconds=seconds)
        return queryset.filter(**self.scope(), **{f"{self.field}__gte": since})


class FinishedFilter(SinceFilter):
    """Jobs that ended within a time range, read from the finished index (status, finished_at):
    the filter names the finished states, or the planner could not use it."""

    title = "finished"
    parameter_name = "finished"
    field = "finished_at"

    def scope(self) -> dict[str, Any]:
        return {"status__in": TERMINAL_STATUSES}


class CreatedFilter(SinceFilter):
    title = "when"
    parameter_name = "when"
    field = "created_at"


class ActorFilter(KnownNamesFilter):
    """The audit rows of one operator, offered from the staff users (a small table), never a
    DISTINCT over the audit log; a name typed into the URL (a deleted user's) works too."""

    title = "actor"
    parameter_name = "actor"
    field = "actor_name"
    SHOWN = 100

    def known_names(self) -> set[str]:
        users = get_user_model()
        return set(users.objects.filter(is_staff=True).order_by(users.USERNAME_FIELD)
                   .values_list(users.USERNAME_FIELD, flat=True)[:self.SHOWN])
