"""The operator actions, as one table: each action's permission, form, plan and transition.

An action first shows a plan (what will change, what will not, and why) on a confirmation page;
the confirming POST applies its transition from ``transitions.py``, which guards every row by
state and writes the audit row in the same transaction. Adding an action is adding an entry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django import forms
from django.db import transaction
from django.db.models import Count
from django.utils import timezone

from .. import enqueuing, schedules, transitions
from ..conf import settings
from ..models import IdempotencyReceipt, Job, Schedule
from ..status import (
    RETRYABLE_STATUSES,
    TERMINAL_STATUSES,
    WAITING_STATUSES,
    JobStatus,
    OverlapPolicy,
)
from .display import is_are, jobs_text, states_text, time_text

# The most jobs one action may touch: their ids travel in the confirmation page.
ACTION_MAX_JOBS = 10_000
RECEIPTS_SHOWN = 50


# --- forms ----------------------------------------------------------------------------------------


class ReasonForm(forms.Form):
    def __init__(self, *args: Any, jobs: int = 1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.jobs = jobs

    reason = forms.CharField(
        required=False, max_length=1000, widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
        help_text="Recorded in the audit trail with your name.",
    )


class DeadLetterForm(ReasonForm):
    reason = forms.CharField(
        required=True, max_length=1000, widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
        help_text="Required. Stored as the jobs' last error and in the audit trail.",
    )


class ReplayForm(ReasonForm):
    KEEP, NEW, NONE = "keep", "new", "none"
    key_choice = forms.ChoiceField(
        label="Idempotency key", widget=forms.RadioSelect,
        choices=[
            (KEEP, "Keep it: the key moves from the original to the replay, so a later "
                   "enqueue with that key returns the replay."),
            (NEW, "Change it to the new key below (one job only)."),
            (NONE, "No key: the original keeps its key, so a later enqueue with it still "
                   "returns the original and does not run again."),
        ],
    )
    new_key = forms.CharField(required=False, max_length=255, label="New key")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("key_choice") == self.NEW:
            if self.jobs != 1:
                raise forms.ValidationError("A new key can be given to one replay at a time.")
            if not data.get("new_key", "").strip():
                raise forms.ValidationError("Type the new idempotency key.")
        return data


# --- plans ----------------------------------------------------------------------------------------


@dataclass
class Plan:
    """What an action will do, said before it is done."""

    title: str
    changes: list[str]
    unchanged: list[str]
    notes: list[str] = field(default_factory=list)
    receipts: list[tuple[str, str]] = field(default_factory=list)
    # The selection's tasks, the most jobs first: what the operator is about to act on.
    tasks: str = ""


def status_counts(ids: Sequence[int]) -> dict[str, int]:
    rows = Job.objects.filter(pk__in=ids).values_list("status").annotate(n=Count("id"))
    return dict(rows)


# A plan names at most this many of the selection's tasks.
PLAN_TASKS_SHOWN = 8


def tasks_text(ids: Sequence[int]) -> str:
    """``demo.charge (3), demo.noop (1)``: the selection's tasks, the most jobs first."""
    rows = list(Job.objects.filter(pk__in=ids).values_list("task").annotate(n=Count("id"))
                .order_by("-n", "task"))
    named = ", ".join(f"{task} ({n})" for task, n in rows[:PLAN_TASKS_SHOWN])
    rest = len(rows) - PLAN_TASKS_SHOWN
    return named + (f", and {rest} more task{'s' if rest != 1 else ''}" if rest > 0 else "")


def retry_plan(ids: Sequence[int], counts: dict[str, int]) -> Plan:
    n, states = states_text(counts, RETRYABLE_STATUSES)
    k, others = states_text(counts, set(JobStatus.values) - set(RETRYABLE_STATUSES))
    changes = [
        f"{jobs_text(n)} ({states}) will go back to ready now, with attempts reset to 0 and a "
        "fresh max age." if n else "No selected job is dead or cancelled: nothing will change."
    ]
    unchanged = (
        [f"{jobs_text(k)} ({others}) {is_are(k)} not dead or cancelled and will not change."]
        if k else []
    )
    notes = ["Idempotency receipts are kept: a side effect these jobs completed under a receipt "
             "will not repeat."]
    permanent = Job.objects.filter(pk__in=ids, status__in=RETRYABLE_STATUSES,
                                   failure_class="permanent").count()
    if permanent:
        notes.append(f"{jobs_text(permanent)} ended with a permanent error and will likely "
                     "fail again, unless its cause has been fixed.")
    return Plan("Retry jobs", changes, unchanged, notes)


def run_now_jobs_plan(ids: Sequence[int], counts: dict[str, int]) -> Plan:
    n, states = states_text(counts, transitions.DUE_LATER_STATUSES)
    k, others = states_text(counts, set(JobStatus.values) - set(transitions.DUE_LATER_STATUSES))
    changes = [
        f"{jobs_text(n)} ({states}) will be due now instead of at their time, their attempts as "
        "they are: ready at once, or, under a limit, waiting for it like any job that comes due."
        if n else "No selected job is scheduled or retrying: nothing will change."
    ]
    unchanged = ([f"{jobs_text(k)} ({others}) {is_are(k)} not waiting for a time and will not "
                  "change."] if k else [])
    notes = []
    failing = Job.objects.filter(pk__in=ids, status=JobStatus.RETRYING,
                                 failure_class="permanent").count()
    if failing:
        notes.append(f"{jobs_text(failing)} last failed with a permanent error and will likely "
                     "fail again.")
    return Plan("Run jobs now", changes, unchanged, notes)


def cancel_plan(ids: Sequence[int], counts: dict[str, int]) -> Plan:
    already_asked = Job.objects.filter(
        pk__in=ids, status=JobStatus.RUNNING, cancel_requested_at__isnull=False
    ).count()
    n, states = states_text(counts, WAITING_STATUSES)
    running = counts.get(JobStatus.RUNNING, 0) - already_asked
    k, finished = states_text(counts, TERMINAL_STATUSES)
    changes = []
    if n:
        changes.append(f"{jobs_text(n)} ({states}) will be cancelled now and will not run.")
    if running:
        changes.append(
            f"{jobs_text(running)} (running) will be cancelled by their worker within about "
            f"{float(settings.CANCEL_CHECK_SECONDS):g} s (a handler with heartbeats may hear "
            "of it sooner): a job whose handler has not started never starts; one that runs is "
            "settled cancelled and its handler stopped where it can be (an async task is "
            "cancelled, a child process is killed) or told (ctx.cancelled; ctx.heartbeat() "
            "raises Cancelled). What a handler reports after that is kept beside its attempt "
            "and changes nothing: the job ends cancelled. A job whose handler finishes before "
            "its worker settles the cancel ends as its handler reported; its page says the "
            "cancel came too late."
        )
    if not changes:
        changes.append("No selected job is waiting or running: nothing will change.")
    unchanged = []
    if already_asked:
        was = "was" if already_asked == 1 else "were"
        unchanged.append(f"{jobs_text(already_asked)} (running) {was} already asked to stop.")
    if k:
        unchanged.append(f"{jobs_text(k)} ({finished}) {is_are(k)} finished and will not "
                         "change.")
    return Plan("Cancel jobs", changes, unchanged)


def dead_letter_plan(ids: Sequence[int], counts: dict[str, int]) -> Plan:
    n, states = states_text(counts, WAITING_STATUSES)
    k, others = states_text(counts, set(JobStatus.values) - set(WAITING_STATUSES))
    changes = [
        f"{jobs_text(n)} ({states}) will move to dead now with the reason below; an operator "
        "can retry them later." if n else "No selected job is waiting: nothing will change."
    ]
    unchanged = [
        f"{jobs_text(k)} ({others}) will not change: running jobs are left to their workers, "
        "finished jobs stay as they are."
    ] if k else []
    return Plan("Dead-letter jobs", changes, unchanged)


def replay_plan(ids: Sequence[int], counts: dict[str, int]) -> Plan:
    finished = list(
        Job.objects.filter(pk__in=ids, status__in=TERMINAL_STATUSES).values_list("id", flat=True)
    )
    receipts = list(
        IdempotencyReceipt.objects.filter(job_id__in=finished).order_by("id")[
            : RECEIPTS_SHOWN + 1]
    )
    n, states = states_text(counts, TERMINAL_STATUSES)
    k, others = states_text(counts, set(JobStatus.values) - set(TERMINAL_STATUSES))
    again = "a new job" if n == 1 else f"{n} new jobs"
    changes = [
        f"{jobs_text(n)} ({states}) will be enqueued again as {again} with the same payload, "
        "queue, priority and limits; the originals do not change (except that keeping the key "
        "moves it)." if n else "No selected job is finished: nothing will be replayed."
    ]
    unchanged = [
        f"{jobs_text(k)} ({others}) {is_are(k)} not finished and will not be replayed: retry "
        "or cancel instead."
    ] if k else []
    notes = [
        "Receipts are taken by the handler under a scope and key it computes; the job's "
        "idempotency key does not choose them, so this choice does not change which receipts "
        "protect the replay. A receipt protects it only if the handler computes the same scope "
        "and key from the payload (not from the job id, which is new) and the receipt has not "
        "expired when the replay runs."
    ]
    now = timezone.now()
    shown = []
    for receipt in receipts[:RECEIPTS_SHOWN]:
        if receipt.expires_at <= now:
            verdict = f"will not protect it: expired at {time_text(receipt.expires_at)}"
        else:
            verdict = (
                f"protects it until {time_text(receipt.expires_at)} if the handler "
                "computes the same key"
            )
        shown.append((f"{receipt.scope}:{receipt.key} (job {receipt.job_id})", verdict))
    if not receipts:
        notes.append("The selected jobs wrote no receipts: nothing protects their side effects "
                     "from repeating.")
    elif len(receipts) > RECEIPTS_SHOWN:
        notes.append(f"Only the first {RECEIPTS_SHOWN} receipts are listed.")
    return Plan("Replay jobs", changes, unchanged, notes, shown)


# --- applying -------------------------------------------------------------------------------------


def apply_retry(ids: list[int], data: dict[str, Any], actor: transitions.Actor) -> str:
    n = transitions.retry_jobs(ids, actor=actor, reason=_reason(data))
    return f"Retried {jobs_text(n)}: ready now with a fresh attempt budget."


def apply_run_jobs_now(ids: list[int], data: dict[str, Any], actor: transitions.Actor) -> str:
    n = transitions.run_jobs_now(ids, actor=actor, reason=_reason(data))
    return f"Made {jobs_text(n)} due now."


def apply_cancel(ids: list[int], data: dict[str, Any], actor: transitions.Actor) -> str:
    cancelled, asked = transitions.cancel_jobs(ids, actor=actor, reason=_reason(data))
    said = [text for n, text in ((cancelled, f"Cancelled {jobs_text(cancelled)}"),
                                 (asked, f"asked {jobs_text(asked)} (running) to stop")) if n]
    return "; ".join(said).capitalize() + "." if said else "No job was cancelled."


def apply_dead_letter(ids: list[int], data: dict[str, Any], actor: transitions.Actor) -> str:
    n = transitions.dead_letter_jobs(ids, _reason(data), actor=actor)
    return f"Moved {jobs_text(n)} to dead."


def apply_replay(ids: list[int], data: dict[str, Any], actor: transitions.Actor) -> str:
    key: str | object | None = {
        ReplayForm.KEEP: enqueuing.KEEP_KEY, ReplayForm.NONE: None,
    }.get(data["key_choice"], data.get("new_key", "").strip())
    originals = list(Job.objects.filter(pk__in=ids, status__in=TERMINAL_STATUSES).order_by("id"))
    # All or none: a key that turns out to be taken rolls back the replays before it.
    with transaction.atomic():
        replays = [
            enqueuing.replay_job(job, idempotency_key=key, actor=actor, reason=_reason(data))
            for job in originals
        ]
    made = ", ".join(f"{o.pk} → {r.pk}" for o, r in zip(originals, replays, strict=True))
    return f"Replayed {jobs_text(len(replays))} as new jobs ({made})." if replays else (
        "No selected job is finished: nothing was replayed."
    )


def _reason(data: dict[str, Any]) -> str:
    return str(data.get("reason", "")).strip()


# --- the table ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Action:
    """One operator action: who may run it, what it asks, what it says, what it does."""

    name: str  # the admin action's name (the <select>'s value)
    permission: str  # the JobAdmin's has_<permission>_permission decides
    description: str
    form: type[ReasonForm]
    plan: Callable[[Sequence[int], dict[str, int]], Plan]
    apply: Callable[[list[int], dict[str, Any], transitions.Actor], str]


ACTIONS: dict[str, Action] = {a.name: a for a in (
    Action("retry_selected", "retry", "Retry selected dead or cancelled jobs", ReasonForm,
           retry_plan, apply_retry),
    Action("run_now_selected", "retry", "Run selected scheduled or retrying jobs now",
           ReasonForm, run_now_jobs_plan, apply_run_jobs_now),
    Action("replay_selected", "replay", "Replay selected finished jobs as new jobs", ReplayForm,
           replay_plan, apply_replay),
    Action("cancel_selected", "cancel", "Cancel selected jobs", ReasonForm, cancel_plan,
           apply_cancel),
    Action("dead_letter_selected", "deadletter", "Dead-letter selected waiting jobs",
           DeadLetterForm, dead_letter_plan, apply_dead_letter),
)}


# The states each job action changes: the job page offers an action only to a job it would change.
ACTION_STATES: dict[str, frozenset[str]] = {
    "retry_selected": frozenset(RETRYABLE_STATUSES),
    "run_now_selected": frozenset(transitions.DUE_LATER_STATUSES),
    "cancel_selected": frozenset({*WAITING_STATUSES, JobStatus.RUNNING}),
    "dead_letter_selected": frozenset(WAITING_STATUSES),
    "replay_selected": frozenset(TERMINAL_STATUSES),
}
# The job page's button of each, in the order shown.
ACTION_BUTTONS = {"run_now_selected": "Run now", "retry_selected": "Retry",
                  "cancel_selected": "Cancel", "dead_letter_selected": "Dead-letter",
                  "replay_selected": "Replay"}


# --- schedule actions -----------------------------------------------------------------------------


def schedules_text(n: int) -> str:
    return f"{n} schedule" if n == 1 else f"{n} schedules"


def schedule_states(ids: Sequence[int]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in Schedule.objects.filter(pk__in=ids).only("paused_at", "retired_at"):
        counts[row.state] = counts.get(row.state, 0) + 1
    return counts


def _others(counts: dict[str, int], state: str, what: str) -> list[str]:
    rest = {s: n for s, n in counts.items() if s != state and n}
    if not rest:
        return []
    k = sum(rest.values())
    states = ", ".join(f"{n} {s}" for s, n in sorted(rest.items()))
    return [f"{schedules_text(k)} ({states}) {is_are(k)} not {state} and will not {what}."]


def pause_plan(ids: Sequence[int], counts: dict[str, int]) -> Plan:
    n = counts.get("active", 0)
    changes = [
        f"{schedules_text(n)} (active) will stop ticking now. Ticks that fall while a schedule "
        "is paused do not run, and are not caught up on resume." if n
        else "No selected schedule is active: nothing will change."
    ]
    notes = ["Jobs already enqueued are not touched: cancel them from the job list. A pause "
             "outlives deploys: the sync of declared schedules never resumes one."]
    return Plan("Pause schedules", changes, _others(counts, "active", "change"), notes)


def resume_plan(ids: Sequence[int], counts: dict[str, int]) -> Plan:
    n = counts.get("paused", 0)
    changes = [
        f"{schedules_text(n)} (paused) will tick again from their next tick after now." if n
        else "No selected schedule is paused: nothing will change."
    ]
    return Plan("Resume schedules", changes, _others(counts, "paused", "change"))


def run_now_plan(ids: Sequence[int], counts: dict[str, int]) -> Plan:
    n = counts.get("active", 0) + counts.get("paused", 0)
    changes = [
        f"{schedules_text(n)} will each get one job now, with the schedule's payload; the "
        "handler sees the time you confirm as ctx.scheduled_at. The schedules' next ticks do "
        "not move." if n else "Every selected schedule is retired: nothing will run."
    ]
    unchanged = ([f"{schedules_text(counts['retired'])} (retired) will not run."]
                 if counts.get("retired") else [])
    busy = Schedule.objects.filter(
        pk__in=ids, retired_at__isnull=True, overlap=OverlapPolicy.SKIP,
        last_job_id__in=Job.objects.filter(
            status__in=[*WAITING_STATUSES, JobStatus.RUNNING]).values("id"),
    ).count()
    notes = [f"{schedules_text(busy)} with overlap 'skip' {is_are(busy)} still waiting for or "
             "running its last job: the new job runs alongside it, and the next ticks are "
             "skipped until it finishes."] if busy else []
    return Plan("Run schedules now", changes, unchanged, notes)


def apply_pause(ids: list[int], data: dict[str, Any], actor: transitions.Actor) -> str:
    n = schedules.pause_schedules(ids, actor=actor, reason=_reason(data))
    return f"Paused {schedules_text(n)}."


def apply_resume(ids: list[int], data: dict[str, Any], actor: transitions.Actor) -> str:
    n = schedules.resume_schedules(ids, actor=actor, reason=_reason(data))
    return f"Resumed {schedules_text(n)}: each ticks next at its first tick after now."


def apply_run_now(ids: list[int], data: dict[str, Any], actor: transitions.Actor) -> str:
    jobs = schedules.run_schedules_now(ids, actor=actor, reason=_reason(data))
    made = ", ".join(str(job.pk) for job in jobs)
    return f"Enqueued {jobs_text(len(jobs))} ({made})." if jobs else "Nothing was enqueued."


SCHEDULE_ACTIONS: dict[str, Action] = {a.name: a for a in (
    Action("pause_selected", "pause", "Pause selected schedules", ReasonForm, pause_plan,
           apply_pause),
    Action("resume_selected", "resume", "Resume selected schedules", ReasonForm, resume_plan,
           apply_resume),
    Action("run_now_selected", "run", "Run selected schedules now", ReasonForm, run_now_plan,
           apply_run_now),
)}
# The states each schedule action changes, and the schedule page's button of each, in order.
SCHEDULE_ACTION_STATES: dict[str, frozenset[str]] = {
    "run_now_selected": frozenset({"active", "paused"}),
    "pause_selected": frozenset({"active"}),
    "resume_selected": frozenset({"paused"}),
}
SCHEDULE_BUTTONS = {"run_now_selected": "Run now", "pause_selected": "Pause",
                    "resume_selected": "Resume"}
