"""What every django-pgjobs admin shares: read-only, estimated counts, its own lookups only."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from ..models import Attempt
from .display import EstimatedCountPaginator, attempt_error_html


class NoWrites:
    """Nothing can be added, changed or deleted here, by anyone (superusers included)."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class AttemptColumns:
    """How an attempt's duration and error show, in the job's inline and the attempt list."""

    @admin.display(description="duration")
    def duration(self, attempt: Attempt) -> str:
        return "-" if attempt.duration_ms is None else f"{attempt.duration_ms} ms"

    @admin.display(description="error (redacted)")
    def error_shown(self, attempt: Attempt) -> str:
        return attempt_error_html(attempt, attempt.job)


class ReadOnlyAdmin(NoWrites, admin.ModelAdmin):
    """Visible with the view permission; nothing can be added, changed or deleted here.

    The list accepts only the query-string lookups its own filters produce. Django's default
    lets any viewer filter on any field (``?payload__password__startswith=P``), which would read
    redacted values one character at a time and scan the whole history; anything else is
    refused with 400, the way Django refuses a disallowed lookup.
    """

    paginator = EstimatedCountPaginator
    show_full_result_count = False
    list_per_page = 50

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        return lookup in self.allowed_lookups(request)

    def allowed_lookups(self, request: HttpRequest | None) -> set[str]:
        """The query-string parameters this admin's list filters and date hierarchy use."""
        allowed: set[str] = set()
        filters = self.get_list_filter(request) if request is not None else self.list_filter
        for item in filters:
            if isinstance(item, type) and issubclass(item, admin.SimpleListFilter):
                allowed.add(str(item.parameter_name))
                continue
            name = item[0] if isinstance(item, list | tuple) else item
            # A field's list filter (choices, boolean, all values) says field__exact and
            # field__isnull; nothing more.
            allowed |= {f"{name}__exact", f"{name}__isnull"}
        if self.date_hierarchy:
            allowed |= {f"{self.date_hierarchy}__{part}" for part in ("year", "month", "day")}
        return allowed
