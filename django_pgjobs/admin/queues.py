"""The queues page: every known queue with its state and backlog; pause and resume.

Pausing needs ``pgjobs.pause_queue``; like the job actions, each pause or resume is asked,
confirmed on a second POST, applied by its transition and audited in the same transaction.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from .. import stats, transitions
from ..models import QueueState
from ..validation import queue_problem
from .base import ReadOnlyAdmin
from .display import duration_text, time_text

ACTIONS = {
    "pause": ("Pause queue {queue}", "Workers will stop claiming from {queue} within a second; "
              "its running jobs finish, and enqueue goes on.", transitions.pause_queue),
    "resume": ("Resume queue {queue}", "Workers will claim from {queue} again at once.",
               transitions.resume_queue),
}


@admin.register(QueueState)
class QueueStateAdmin(ReadOnlyAdmin):
    """Not a list of rows: the page lists every known queue, with or without a row."""

    def has_pause_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request) and request.user.has_perm("pgjobs.pause_queue")

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        context: dict[str, Any] = {
            **self.admin_site.each_context(request), "opts": self.opts, "title": "Queues",
            "can_pause": self.has_pause_permission(request), **(extra_context or {}),
        }
        if request.method == "POST":
            if not self.has_pause_permission(request):
                raise PermissionDenied
            action, queue = request.POST.get("action", ""), request.POST.get("queue", "")
            if action not in ACTIONS or queue_problem(queue) is not None:
                raise PermissionDenied("unknown action or queue")
            title, text, transition = ACTIONS[action]
            if request.POST.get("pgjobs_confirm") != "yes":
                context["confirm"] = {
                    "title": title.format(queue=queue), "text": text.format(queue=queue),
                    "action": action, "queue": queue,
                }
                return TemplateResponse(request, "admin/pgjobs/queuestate/queues.html", context)
            reason = request.POST.get("reason", "")[:1000].strip()
            changed = transition(queue, actor=transitions.Actor.of(request.user), reason=reason)
            state = "paused" if action == "pause" else "active"
            self.message_user(request, f"Queue {queue}: {state}"
                              + ("." if changed else " (it already was)."), messages.SUCCESS)
            return HttpResponseRedirect(reverse("admin:pgjobs_queuestate_changelist"))
        context["rows"] = queue_rows()
        return TemplateResponse(request, "admin/pgjobs/queuestate/queues.html", context)


def queue_rows() -> list[dict[str, Any]]:
    """Every known queue: the ones with jobs, the declared ones, and the ones ever paused."""
    queues = {q.queue: q for q in stats.queue_stats()}
    states = {s.name: s for s in QueueState.objects.order_by("name")}
    rows = []
    for name in sorted({*queues, *states}):
        q, state = queues.get(name), states.get(name)
        age = q.oldest_ready_age_seconds if q else None
        rows.append({
            "queue": name, "paused": bool(state and state.paused),
            "ready": q.ready if q else 0, "running": q.running if q else 0,
            "oldest_ready": "-" if age is None else duration_text(age),
            "changed_at": time_text(state.changed_at if state else None),
            "changed_by": state.changed_by if state else "",
            "reason": state.reason if state else "",
        })
    return rows
