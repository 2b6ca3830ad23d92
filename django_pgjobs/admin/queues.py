"""The queues page: every known queue with its state and backlog; pause, resume, run now.

Pausing needs ``pgjobs.pause_queue``, running a queue's waiting jobs now ``pgjobs.retry_job``
(as the job list's run now); like the job actions, each is asked, confirmed on a second POST,
applied by its transition and audited in the same transaction.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from .. import stats, transitions
from ..models import Job, QueueState
from ..validation import queue_problem
from .base import ReadOnlyAdmin
from .display import duration_text, time_text

# The most jobs one run now of a queue moves (the audit row lists them).
RUN_NOW_MAX = 10_000


def _pause(queue: str, actor: transitions.Actor, reason: str) -> str:
    changed = transitions.pause_queue(queue, actor=actor, reason=reason)
    return f"Queue {queue}: paused" + ("." if changed else " (it already was).")


def _resume(queue: str, actor: transitions.Actor, reason: str) -> str:
    changed = transitions.resume_queue(queue, actor=actor, reason=reason)
    return f"Queue {queue}: active" + ("." if changed else " (it already was).")


def _due_later(queue: str) -> list[int]:
    return list(Job.objects.filter(queue=queue, status__in=transitions.DUE_LATER_STATUSES)
                .order_by("run_at", "id").values_list("pk", flat=True)[:RUN_NOW_MAX])


def _run_now(queue: str, actor: transitions.Actor, reason: str) -> str:
    moved = transitions.run_jobs_now(_due_later(queue), actor=actor, reason=reason)
    return f"Queue {queue}: made {moved} job{'s' if moved != 1 else ''} due now."


def _run_now_text(queue: str) -> str:
    n = Job.objects.filter(queue=queue, status__in=transitions.DUE_LATER_STATUSES).count()
    shown = min(n, RUN_NOW_MAX)
    more = f" (the {RUN_NOW_MAX:,} due soonest of {n:,}; run it again for the rest)" \
        if n > RUN_NOW_MAX else ""
    return (f"{shown} job{'s' if shown != 1 else ''} of {queue} waiting for their time "
            f"(scheduled, or retrying after a backoff){more} will be due now, their attempts "
            "as they are. A job that failed for good may fail again: look at the queue's "
            "retrying jobs first.")


@dataclass(frozen=True)
class QueueAction:
    """One action on a queue: its title, what it will do, the permission it needs, the deed."""

    title: str  # with {queue}
    plan: Callable[[str], str]
    permission: str
    apply: Callable[[str, transitions.Actor, str], str]


ACTIONS = {
    "pause": QueueAction(
        "Pause queue {queue}", lambda q: f"Workers will stop claiming from {q} within a second; "
        "its running jobs finish, and enqueue goes on.", "pause_queue", _pause),
    "resume": QueueAction(
        "Resume queue {queue}", lambda q: f"Workers will claim from {q} again at once.",
        "pause_queue", _resume),
    "run_now": QueueAction("Run queue {queue}'s waiting jobs now", _run_now_text, "retry_job",
                           _run_now),
}


@admin.register(QueueState)
class QueueStateAdmin(ReadOnlyAdmin):
    """Not a list of rows: the page lists every known queue, with or without a row."""

    def may(self, request: HttpRequest, action: str) -> bool:
        return self.has_view_permission(request) and request.user.has_perm(
            f"pgjobs.{ACTIONS[action].permission}")

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        context: dict[str, Any] = {
            **self.admin_site.each_context(request), "opts": self.opts, "title": "Queues",
            "can_pause": self.may(request, "pause"),
            "can_run_now": self.may(request, "run_now"), **(extra_context or {}),
        }
        if request.method == "POST":
            action, queue = request.POST.get("action", ""), request.POST.get("queue", "")
            if action not in ACTIONS or queue_problem(queue) is not None:
                raise PermissionDenied("unknown action or queue")
            if not self.may(request, action):
                raise PermissionDenied
            chosen = ACTIONS[action]
            if request.POST.get("pgjobs_confirm") != "yes":
                context["confirm"] = {
                    "title": chosen.title.format(queue=queue), "text": chosen.plan(queue),
                    "action": action, "queue": queue,
                }
                return TemplateResponse(request, "admin/pgjobs/queuestate/queues.html", context)
            reason = request.POST.get("reason", "")[:1000].strip()
            said = chosen.apply(queue, transitions.Actor.of(request.user), reason)
            self.message_user(request, said, messages.SUCCESS)
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
            "due_later": sum(q.count(s) for s in transitions.DUE_LATER_STATUSES) if q else 0,
            "jobs_url": f"{reverse('admin:pgjobs_job_changelist')}?{urlencode({'queue': name})}",
            "oldest_ready": "-" if age is None else duration_text(age),
            "changed_at": time_text(state.changed_at if state else None),
            "changed_by": state.changed_by if state else "",
            "reason": state.reason if state else "",
        })
    return rows
