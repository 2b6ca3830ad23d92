"""What every django-pgjobs admin shares: read-only, estimated counts, its own lookups only."""

from __future__ import annotations

from typing import Any, ClassVar

from django.contrib import admin, messages
from django.contrib.admin.views.main import PAGE_VAR, ChangeList
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

from ..models import Attempt
from .display import (
    MAX_PAGES,
    EstimatedCountPaginator,
    attempt_error_html,
    searchable,
    time_column,
)


class NoWrites:
    """Nothing can be added, changed or deleted here, by anyone (superusers included)."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class TimeColumns:
    """Every time the admins show, each read by ``time_text`` (to the millisecond, with zone).

    Django's own rendering says ``7:04 a.m.``: a lease expiry, a heartbeat and a claim, or five
    attempts with backoff, all read the same. List and fieldset entries name these instead of
    the model's fields.
    """

    run_at_shown = time_column("run_at")
    deadline_shown = time_column("deadline")
    created_at_shown = time_column("created_at")
    started_at_shown = time_column("started_at")
    finished_at_shown = time_column("finished_at")
    updated_at_shown = time_column("updated_at")
    claimed_at_shown = time_column("claimed_at", sortable=True)
    lease_expires_at_shown = time_column("lease_expires_at")
    heartbeat_at_shown = time_column("heartbeat_at")
    scheduled_at_shown = time_column("scheduled_at")
    cancel_requested_at_shown = time_column("cancel_requested_at")
    expires_at_shown = time_column("expires_at", sortable=True)


class AttemptColumns:
    """How an attempt's duration and error show, in the job's inline and the attempt list."""

    @admin.display(description="duration")
    def duration(self, attempt: Attempt) -> str:
        return "-" if attempt.duration_ms is None else f"{attempt.duration_ms} ms"

    @admin.display(description="error (redacted)")
    def error_shown(self, attempt: Attempt) -> str:
        return attempt_error_html(attempt, attempt.job)


class RefuseForgedActions:
    """A POST for an action this user may not run is refused with 403, not ignored.

    Django answers an action it does not offer with a "no action selected" message; a forged
    form or an old tab asking for one is refused outright.
    """

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if request.method == "POST":
            allowed = self.get_actions(request)  # type: ignore[attr-defined]
            if any(name and name not in allowed for name in request.POST.getlist("action")):
                raise PermissionDenied
        return super().changelist_view(request, extra_context)  # type: ignore[misc]


class OwnLookupsOnly:
    """The list accepts only the query-string lookups its own filters produce.

    Django's default lets any viewer filter on any field (``?payload__password__startswith=P``),
    which would read redacted values one character at a time and scan the whole history;
    anything else is refused with 400, the way Django refuses a disallowed lookup. So is a value
    PostgreSQL cannot take as a parameter (a NUL character), which would otherwise fail the
    query with a DataError.
    """

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        return lookup in self.allowed_lookups(request) and searchable(str(value))

    def allowed_lookups(self, request: HttpRequest | None) -> set[str]:
        """The query-string parameters this admin's list filters and date hierarchy use."""
        allowed: set[str] = set()
        filters = (self.get_list_filter(request)  # type: ignore[attr-defined]
                   if request is not None else self.list_filter)  # type: ignore[attr-defined]
        for item in filters:
            if isinstance(item, type) and issubclass(item, admin.SimpleListFilter):
                allowed.add(str(item.parameter_name))
                continue
            name = item[0] if isinstance(item, list | tuple) else item
            # A field's list filter (choices, boolean, all values) says field__exact and
            # field__isnull; nothing more.
            allowed |= {f"{name}__exact", f"{name}__isnull"}
        hierarchy = getattr(self, "date_hierarchy", None)
        if hierarchy:
            allowed |= {f"{hierarchy}__{part}" for part in ("year", "month", "day")}
        return allowed


class IndexedOrderChangeList(ChangeList):
    """A list that sorts only on the columns in ``sortable_by``, whatever ``?o=`` asks.

    Django sorts on any column number in the query string, sortable or not: ``?o=-7.5`` on a big
    history reads every row and sorts them on disk. The columns left sortable are the indexed
    ones.
    """

    def get_ordering_field(self, field_name: Any) -> Any:
        if self.sortable_by is not None and field_name not in self.sortable_by:
            return None
        return super().get_ordering_field(field_name)


class ReadOnlyAdmin(NoWrites, OwnLookupsOnly, RefuseForgedActions, admin.ModelAdmin):
    """Visible with the view permission; nothing can be added, changed or deleted here."""

    paginator = EstimatedCountPaginator
    show_full_result_count = False
    list_per_page = 50
    sortable_by: ClassVar[tuple[str, ...] | list[str] | None] = ("id",)

    # Django's own change history is always empty here (nothing is changed through the admin);
    # the page leaves its link out, and its URL answers with the record, where the operator
    # history of a job is shown.
    change_form_template = "admin/pgjobs/change_form.html"

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return IndexedOrderChangeList

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        page = request.GET.get(PAGE_VAR, "")
        if page.isascii() and page.isdigit() and int(page) > MAX_PAGES:
            self.message_user(request, f"The list stops at page {MAX_PAGES}: filter or search to "
                              "reach older rows.", messages.WARNING)
            query = request.GET.copy()
            query[PAGE_VAR] = str(MAX_PAGES)
            return HttpResponseRedirect(f"{request.path}?{query.urlencode()}")
        return super().changelist_view(request, extra_context)

    def history_view(
        self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        opts = self.opts
        return HttpResponseRedirect(
            reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[object_id]))
