"""The workers page: each worker process as its heartbeat row says, live ones first.

Read only, with the view permission of the worker model (``pgjobs.view_workerprocess``).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from .. import stats
from ..conf import settings
from ..models import WorkerProcess
from .base import ReadOnlyAdmin
from .display import duration_text, time_text


@admin.register(WorkerProcess)
class WorkerProcessAdmin(ReadOnlyAdmin):
    """Not Django's list: every row with its state, which the database works out."""

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        workers = [{
            **asdict(w), "queues_text": ", ".join(w.queues) if w.queues else "every queue",
            "started": time_text(w.started_at), "last_seen": time_text(w.last_seen_at),
            "seen_ago": duration_text(w.seen_seconds_ago),
        } for w in stats.workers()]
        return TemplateResponse(request, "admin/pgjobs/workerprocess/workers.html", {
            **self.admin_site.each_context(request), "opts": self.opts, "title": "Workers",
            "workers": workers, "shown": stats.WORKERS_SHOWN,
            "heartbeat": duration_text(float(settings.WORKER_HEARTBEAT_SECONDS)),
            **(extra_context or {}),
        })
