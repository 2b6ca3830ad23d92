"""The invariants a harness run must keep, checked from the database and the run's record.

Every time compared here comes from the database clock: claims and settlements (Attempt rows),
the handlers' ledger (Run, Effect) and the harness's fault times.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Any

from django.utils import timezone

from django_pgjobs.conf import settings
from django_pgjobs.models import Attempt, Dependency, Job, Schedule, in_claim_order
from django_pgjobs.status import (
    AttemptOutcome,
    FailureClass,
    JobStatus,
    OverlapPolicy,
    TerminalReason,
)
from django_pgjobs.worker.slots import START_CANCEL_FRESH_SECONDS
from testproject.chaos.models import Effect, Run
from tests.harness.records import (
    LIMITED,
    LIMITED_RUNNING,
    PLAIN,
    POISON,
    RATED,
    RATED_BURST,
    RATED_PER_SECOND,
    RECEIPTED,
    RunRecord,
    Target,
)

TERMINAL = {JobStatus.SUCCEEDED, JobStatus.DEAD, JobStatus.CANCELLED}
WAITING = {JobStatus.SCHEDULED, JobStatus.RETRYING}
# A settlement by the lease holder ends the lease; these outcomes are such settlements.
# A timeout or a cancel is a takeover: the worker settles the attempt in the handler's place and
# the lease ends there, though an abandoned thread may run on (as a stale worker would).
SETTLED_BY_HOLDER = {
    AttemptOutcome.SUCCEEDED, AttemptOutcome.FAILED, AttemptOutcome.DEAD,
    AttemptOutcome.SNOOZED, AttemptOutcome.RELEASED,
    AttemptOutcome.TIMED_OUT, AttemptOutcome.CANCELLED,
}
# Attempts that hand their count back: a release, a snooze, a rolling-deploy retry.
UNCOUNTED_CLASSES = {FailureClass.UNKNOWN_TASK, FailureClass.UNSUPPORTED_VERSION}
# Outcomes a job's attempts counter leaves out: hand-backs, and late reports with no row of
# their own (an ended attempt's late report is kept beside it and adds nothing).
UNCOUNTED_OUTCOMES = {AttemptOutcome.RELEASED, AttemptOutcome.SNOOZED, AttemptOutcome.LOST}
# An executor starts a claimed job without asking about cancels when its last word on them is at
# most START_CANCEL_FRESH_SECONDS old; the handler's Run row is stamped a moment after it starts.
CANCEL_START_SLACK = timedelta(seconds=START_CANCEL_FRESH_SECONDS + 0.1)
# Main-loop tick (0.25 s), process scheduling on a busy host, the claim and the handler's start.
SCHEDULING_SLACK_SECONDS = 1.5
# Attempt.claimed_at is the claim statement's time, taken as it starts: before it found the row
# ready, and before a settlement that it waited on had committed. A claim that followed a
# settlement can therefore be stamped a little before the settlement's own time.
CLAIM_TIMESTAMP_SKEW = timedelta(seconds=0.25)


@dataclass
class Check:
    name: str
    ok: bool
    summary: str
    problems: list[str] = field(default_factory=list)


@dataclass
class Snapshot:
    """The database after the run, indexed for the checks."""

    jobs: dict[int, Job]
    by_key: dict[str, Job]
    attempts: dict[int, list[Attempt]]
    runs: dict[int, list[Run]]
    effects: Counter[str]
    receipted_effects: Counter[str]
    now: datetime
    # (job id, attempt number, worker id, written at) of every receipted effect.
    receipted_rows: list[tuple[int, int, str, datetime]]
    schedules: list[Schedule]

    @classmethod
    def load(cls) -> Snapshot:
        jobs = {job.pk: job for job in Job.objects.all()}
        attempts: dict[int, list[Attempt]] = defaultdict(list)
        for attempt in Attempt.objects.order_by("claimed_at", "id"):
            attempts[attempt.job_id].append(attempt)
        for job in jobs.values():
            # A running attempt's row is written when it ends: until then the job is its record.
            if job.status == JobStatus.RUNNING and not any(
                    a.lease_token == job.lease_token for a in attempts[job.pk]):
                attempts[job.pk].append(Attempt(
                    job=job, number=job.attempts, worker_id=job.lease_owner,
                    lease_token=job.lease_token, claimed_at=job.claimed_at,
                    outcome=AttemptOutcome.RUNNING))
            # Nor has a success, ever: the job keeps it, with no lease token.
            success = job.success_attempt()
            if success is not None:
                attempts[job.pk] = in_claim_order([*attempts[job.pk], success])
        runs: dict[int, list[Run]] = defaultdict(list)
        for run in Run.objects.order_by("started_at", "id"):
            runs[run.job_id].append(run)
        effects: Counter[str] = Counter()
        receipted: Counter[str] = Counter()
        rows = []
        for key, is_receipted, job_id, attempt, worker, at in Effect.objects.values_list(
                "key", "receipted", "job_id", "attempt", "worker_id", "created_at"):
            (receipted if is_receipted else effects)[key] += 1
            if is_receipted:
                rows.append((job_id, attempt, worker, at))
        return cls(
            jobs=jobs,
            by_key={j.idempotency_key: j for j in jobs.values() if j.idempotency_key},
            attempts=attempts, runs=runs, effects=effects, receipted_effects=receipted,
            now=timezone.now(), receipted_rows=rows,
            schedules=list(Schedule.objects.order_by("id")),
        )

    def effect_count(self, job: Job) -> int:
        key = job.payload.get("key", "") if isinstance(job.payload, dict) else ""
        return (self.receipted_effects if job.task == RECEIPTED else self.effects)[key]


def lease_end(attempt: Attempt, job: Job) -> datetime:
    """When ``attempt``'s lease stopped being valid: its expiry, or its holder's settlement."""
    expiry = attempt.claimed_at + timedelta(seconds=job.lease_seconds)
    if attempt.outcome in SETTLED_BY_HOLDER and attempt.finished_at is not None:
        return min(attempt.finished_at, expiry)
    return expiry  # expired and rescued, lost, or still running


def recovery_bound_seconds(lease_seconds: float) -> float:
    """The longest a killed or stopped worker's job may wait before another worker claims it.

    lease (the job's lease runs out; the fault came after the claim, so it ends within one lease
    of the fault) + 1.1 x rescue interval (the next rescue step on any worker, with its jitter)
    + the backoff cap (the retry delay is at most PGJOBS_RETRY_MAX_SECONDS) + 1.1 x poll
    interval (the promote step makes it ready) + 1.2 x poll interval (an idle executor's
    jittered wait before its next claim) + scheduling slack.
    """
    poll = float(settings.POLL_INTERVAL_SECONDS)
    return (lease_seconds + 1.1 * float(settings.RESCUE_INTERVAL_SECONDS)
            + float(settings.RETRY_MAX_SECONDS) + 2.3 * poll + SCHEDULING_SLACK_SECONDS)


def _check(name: str, problems: list[str], summary: str) -> Check:
    return Check(name, not problems, summary, problems)


def every_job_ended(snap: Snapshot, record: RunRecord) -> Check:
    problems = []
    counts: Counter[str] = Counter()
    for job in snap.jobs.values():
        if job.status in TERMINAL:
            counts["terminal"] += 1
        elif job.status in WAITING and job.run_at > snap.now:
            counts["waiting"] += 1
        else:
            problems.append(f"job {job.pk} ({job.task}) is {job.status}, due {job.run_at}")
    tracked = (record.bulk_keys + record.limited_keys + record.later_keys + record.workflow_keys
               + record.flood.ordinary_keys
               + record.flood.flood_keys + record.flood.poison_keys
               + [t.key for t in record.targets] + list(record.replays.calls)
               + record.lifecycle.queued_keys)
    missing = [key for key in tracked if key not in snap.by_key]
    problems += [f"enqueued {key} has no job row" for key in missing]
    later = [snap.by_key[k] for k in record.later_keys if k in snap.by_key]
    problems += [f"{j.idempotency_key} should still wait but is {j.status}" for j in later
                 if j.status != JobStatus.SCHEDULED]
    return _check("every job is terminal or legitimately waiting", problems,
                  f"{counts['terminal']} terminal, {counts['waiting']} waiting for a later time, "
                  f"{len(problems)} neither")


def leases_never_overlap(snap: Snapshot) -> Check:
    problems, compared, close = [], 0, 0
    for job_id, attempts in snap.attempts.items():
        job = snap.jobs[job_id]
        held_until: datetime | None = None
        for attempt in attempts:
            compared += 1
            if held_until is not None and attempt.claimed_at < held_until:
                if attempt.claimed_at >= held_until - CLAIM_TIMESTAMP_SKEW:
                    close += 1
                else:
                    problems.append(f"job {job_id}: attempt {attempt.number} by "
                                    f"{attempt.worker_id} claimed at {attempt.claimed_at} while "
                                    f"a lease ran to {held_until}")
            end = lease_end(attempt, job)
            held_until = end if held_until is None else max(held_until, end)
    return _check("no job was leased to two workers at once", problems,
                  f"{compared} attempts on {len(snap.attempts)} jobs; {close} claims stamped "
                  f"less than {CLAIM_TIMESTAMP_SKEW.total_seconds():g}s before the previous "
                  "lease's end (the claim's timestamp is its statement's start)")


def runs_never_overlap(snap: Snapshot) -> Check:
    """No two runs of a job overlapped while both of their leases were valid."""
    problems, raw_overlaps, pairs = [], 0, 0
    for job_id, runs in snap.runs.items():
        job = snap.jobs.get(job_id)
        if job is None:
            continue
        by_token = {a.lease_token: a for a in snap.attempts.get(job_id, [])}
        windows = []
        success = job.success_attempt()
        for run in runs:
            attempt = by_token.get(run.lease_token)
            if attempt is None and success is not None and (
                    run.attempt, run.worker_id) == (success.number, success.worker_id):
                # A run whose attempt has no row: the success, which its job keeps. An attempt
                # with a row of the same number and worker (released, then claimed again) has
                # its own token.
                attempt = success
            if attempt is None:
                problems.append(f"job {job_id}: run by {run.worker_id} has no attempt row")
                continue
            if run.started_at < attempt.claimed_at:
                problems.append(f"job {job_id}: a run started before its claim")
            end = lease_end(attempt, job)
            if run.finished_at is not None:
                end = min(end, run.finished_at)
            windows.append((run, run.started_at, end))
        for i, (run_a, start_a, end_a) in enumerate(windows):
            for run_b, start_b, end_b in windows[i + 1:]:
                pairs += 1
                if (run_a.finished_at and run_b.finished_at and start_b < run_a.finished_at
                        and start_a < run_b.finished_at):
                    raw_overlaps += 1
                if max(start_a, start_b) < min(end_a, end_b):
                    problems.append(
                        f"job {job_id}: {run_a.worker_id} (attempt {run_a.attempt}) and "
                        f"{run_b.worker_id} (attempt {run_b.attempt}) ran at once under "
                        "valid leases")
    return _check("no job ran on two workers at once while both held a valid lease", problems,
                  f"{pairs} pairs of runs of the same job compared; {raw_overlaps} ran at "
                  "overlapping times (a stale worker running on after losing its lease), none "
                  "under two valid leases" if not problems else f"{pairs} pairs compared")


def counts_an_attempt(attempt: Attempt) -> bool:
    """Whether ``attempt`` is one its job's ``attempts`` counts.

    A release, a snooze and a deploy-window wait give theirs back, unless a pending cancel
    ended the job with it (its row then says cancelled and it counts).
    """
    if attempt.outcome in UNCOUNTED_OUTCOMES:
        return False
    return (attempt.outcome == AttemptOutcome.CANCELLED
            or attempt.failure_class not in UNCOUNTED_CLASSES)


def no_stale_settlement(snap: Snapshot) -> Check:
    """A report that lost its lease changed nothing: the job agrees with its winning attempts."""
    problems = []
    lost = 0
    for job_id, attempts in snap.attempts.items():
        job = snap.jobs[job_id]
        lost += sum(a.outcome == AttemptOutcome.LOST for a in attempts)
        counted = sum(counts_an_attempt(a) for a in attempts)
        if job.attempts != counted:
            problems.append(f"job {job_id}: attempts is {job.attempts}, its attempt rows "
                            f"account for {counted}")
        applied = [a for a in attempts if a.outcome != AttemptOutcome.LOST]
        last = applied[-1].outcome if applied else None
        if (job.status == JobStatus.RUNNING) != (last == AttemptOutcome.RUNNING):
            problems.append(f"job {job_id} is {job.status} but its last applied attempt is {last}")
        if job.status == JobStatus.DEAD and last not in (
                AttemptOutcome.DEAD, AttemptOutcome.LEASE_EXPIRED, AttemptOutcome.TIMED_OUT):
            problems.append(f"job {job_id} is dead but its last applied attempt is {last}")
        if job.status != JobStatus.SUCCEEDED:
            continue
        winners = [a for a in attempts if a.outcome == AttemptOutcome.SUCCEEDED]
        if len(winners) != 1 or last != AttemptOutcome.SUCCEEDED:
            problems.append(f"job {job_id} succeeded with {len(winners)} succeeded attempts, "
                            f"last applied {last}")
            continue
        result = job.result if isinstance(job.result, dict) else {}
        if "worker" in result and (result.get("attempt"), result.get("worker")) != (
                winners[0].number, winners[0].worker_id):
            problems.append(f"job {job_id}: result came from attempt {result.get('attempt')} on "
                            f"{result.get('worker')}, but the winning attempt is "
                            f"{winners[0].number} on {winners[0].worker_id}")
    return _check("no stale settlement was applied", problems,
                  f"{lost} late reports recorded as lost; every job's state, attempt count and "
                  "result match its winning attempts" if not problems else f"{lost} lost")


def receipted_effects_once(snap: Snapshot) -> Check:
    problems = [f"receipted effect {key} happened {n} times"
                for key, n in snap.receipted_effects.items() if n > 1]
    jobs = [j for j in snap.jobs.values() if j.task == RECEIPTED]
    problems += [f"job {j.pk} succeeded but its receipted effect never happened"
                 for j in jobs if j.status == JobStatus.SUCCEEDED and snap.effect_count(j) == 0]
    return _check("receipted side effects happened exactly once", problems,
                  f"{len(jobs)} receipted jobs, {sum(snap.receipted_effects.values())} effects")


def unreceipted_duplicates(snap: Snapshot) -> tuple[Check, dict[str, int]]:
    jobs = [j for j in snap.jobs.values() if j.task == PLAIN]
    problems = [f"job {j.pk} succeeded but its effect never happened"
                for j in jobs if j.status == JobStatus.SUCCEEDED and snap.effect_count(j) == 0]
    repeated = {key: n for key, n in snap.effects.items() if n > 1}
    figures = {"jobs": len(jobs), "effects": sum(snap.effects.values()),
               "duplicates": sum(n - 1 for n in repeated.values()), "keys_repeated": len(repeated)}
    return _check("unreceipted side effects: every succeeded job's happened", problems,
                  f"{figures['jobs']} plain jobs, {figures['effects']} effects, "
                  f"{figures['duplicates']} duplicates on {figures['keys_repeated']} keys "
                  "(at-least-once: why receipts exist)"), figures


def poison_dead(snap: Snapshot, record: RunRecord) -> Check:
    problems = []
    for key in record.flood.poison_keys:
        job = snap.by_key.get(key)
        if job is None:
            continue
        outcomes = [a.outcome for a in snap.attempts.get(job.pk, [])]
        if (job.status, job.terminal_reason, job.attempts) != (
                JobStatus.DEAD, TerminalReason.ATTEMPTS_EXHAUSTED, job.max_attempts):
            problems.append(f"{key}: {job.status}/{job.terminal_reason or '-'} after "
                            f"{job.attempts} of {job.max_attempts} attempts")
        if outcomes != [AttemptOutcome.LEASE_EXPIRED] * job.max_attempts:
            problems.append(f"{key}: attempt outcomes {outcomes}")
    return _check("each poison job is dead: attempts_exhausted, attempts == max_attempts",
                  problems, f"{len(record.flood.poison_keys)} poison jobs")


# Per targeted fault: applied attempt outcomes (releases left out), effects, and extras.
_EXPECTED: dict[tuple[str, str, str], tuple[list[str], int]] = {
    ("kill", PLAIN, "before_effect"): (["lease_expired", "succeeded"], 1),
    ("kill", PLAIN, "after_effect"): (["lease_expired", "succeeded"], 2),
    ("kill", RECEIPTED, "after_effect"): (["lease_expired", "succeeded"], 1),
    # The rescue's lease_expired stands; the stopped worker's late report is kept beside it.
    ("stop", PLAIN, "before_effect"): (["lease_expired", "succeeded"], 2),
    ("stop", RECEIPTED, "before_effect"): (["lease_expired", "succeeded"], 1),
    ("disconnect", PLAIN, "before_effect"): (["failed", "succeeded"], 1),
}


def target_observed(snap: Snapshot, target: Target) -> dict[str, Any]:
    """What became of a targeted job, in the terms the expectations use."""
    job = snap.jobs.get(target.job_id)
    attempts = snap.attempts.get(target.job_id, [])
    result = job.result if job is not None and isinstance(job.result, dict) else {}
    return {
        "status": job.status if job is not None else None,
        "outcomes": [a.outcome for a in attempts if a.outcome != AttemptOutcome.RELEASED],
        "first_reported": attempts[0].reported_outcome if attempts else None,
        "first_failure_class": attempts[0].failure_class if attempts else None,
        "effects": snap.effect_count(job) if job is not None else 0,
        "effect_from_attempt": (result.get("effect") or {}).get("attempt"),
        "struck": target.struck,
        "resumed_after_takeover": target.resumed_after_takeover,
        "worker_went_on": target.worker_went_on,
    }


def targets_as_expected(snap: Snapshot, record: RunRecord) -> Check:
    problems = []
    for target in record.targets:
        seen = target_observed(snap, target)
        outcomes, effects = _EXPECTED[(target.fault, target.task, target.hold)]
        wanted: dict[str, Any] = {"status": "succeeded", "outcomes": outcomes,
                                  "effects": effects, "struck": True}
        if target.fault == "kill" and target.task == RECEIPTED:
            wanted["effect_from_attempt"] = 1  # the retry replayed the stored result
        if target.fault == "stop":
            # Resumed without its lease: a plain handler's late success is lost; a receipted
            # one's receipt block finds the lease gone and rolls back (LeaseLost, a failure).
            wanted |= {"first_reported": "failed" if target.task == RECEIPTED else "succeeded",
                       "resumed_after_takeover": True}
        if target.fault == "disconnect":
            wanted |= {"first_failure_class": "transient", "worker_went_on": True}
        wrong = {k: seen[k] for k, v in wanted.items() if seen[k] != v}
        if wrong:
            problems.append(f"{target.key} (job {target.job_id}): wanted "
                            f"{ {k: wanted[k] for k in wrong} }, got {wrong}")
    return _check("each targeted fault ended exactly as expected", problems,
                  f"{len(record.targets)} targeted faults")


def recoveries(snap: Snapshot, record: RunRecord) -> dict[str, list[float]]:
    """Seconds from each kill or stop to what became of each job it interrupted.

    ``targeted``: to the next claim of the held job, which jumps the queue. For every other job
    the fault interrupted (``bystanders``): to the rescue step taking its lease back, and to
    its next claim, which also counts the time it queued behind other ready work.
    """
    found: dict[str, list[float]] = {"targeted": [], "bystanders_rescued": [],
                                     "bystanders_reclaimed": []}
    targeted = {t.job_id: t.name for t in record.targets}
    for fault in record.faults:
        if fault.kind not in ("kill", "stop"):
            continue
        for job_id in set(fault.interrupted):
            attempts = snap.attempts.get(job_id, [])
            struck = [a for a in attempts
                      if a.claimed_at <= fault.at and a.worker_id == fault.worker_id]
            later = [a.claimed_at for a in attempts if a.claimed_at > fault.at]
            if not struck or struck[-1].outcome not in (
                    AttemptOutcome.LEASE_EXPIRED, AttemptOutcome.LOST):
                continue  # it finished or was handed back before the fault took hold
            reclaimed = (min(later) - fault.at).total_seconds() if later else None
            if targeted.get(job_id) == fault.origin:
                if reclaimed is not None:
                    found["targeted"].append(reclaimed)
                continue
            # A lost attempt's finished_at is its late report, not its rescue.
            if struck[-1].outcome == AttemptOutcome.LEASE_EXPIRED and struck[-1].finished_at:
                found["bystanders_rescued"].append(
                    (struck[-1].finished_at - fault.at).total_seconds())
            if reclaimed is not None:
                found["bystanders_reclaimed"].append(reclaimed)
    return found


def recovery_bounded(snap: Snapshot, record: RunRecord, lease_seconds: float) -> Check:
    found = recoveries(snap, record)
    bound = recovery_bound_seconds(lease_seconds)
    problems = [f"a targeted job waited {s:.2f}s for another worker (bound {bound:.2f}s)"
                for s in found["targeted"] if s > bound]
    expected = sum(1 for t in record.targets if t.fault in ("kill", "stop") and t.struck)
    if len(found["targeted"]) != expected:
        problems.append(f"{expected} targeted kills and stops, {len(found['targeted'])} "
                        "recoveries measured")
    return _check("recovery after a kill or stop is bounded", problems,
                  f"targeted: claimed again within {_max(found['targeted'])}, bound "
                  f"{bound:.2f}s; other interrupted jobs: rescued within "
                  f"{_max(found['bystanders_rescued'])}, claimed again within "
                  f"{_max(found['bystanders_reclaimed'])} (queueing included)")


def replays_deduplicated(snap: Snapshot, record: RunRecord) -> Check:
    problems = []
    calls = 0
    for key, results in record.replays.calls.items():
        calls += len(results)
        ids = {job_id for job_id, _ in results}
        created = sum(created for _, created in results)
        rows = sum(j.idempotency_key == key and j.task == RECEIPTED for j in snap.jobs.values())
        if len(ids) != 1 or created != 1 or rows != 1:
            problems.append(f"{key}: {len(results)} enqueues returned jobs {sorted(ids)}, "
                            f"{created} created, {rows} rows")
        job = snap.by_key.get(key)
        if job is not None and job.status == JobStatus.SUCCEEDED and snap.effect_count(job) != 1:
            problems.append(f"{key}: {snap.effect_count(job)} effects")
    return _check("replayed enqueues with one idempotency key made one job", problems,
                  f"{calls} enqueues of {len(record.replays.calls)} keys")


def workers_held_up(snap: Snapshot, record: RunRecord) -> Check:
    problems = []
    poison_runs = [run for runs in snap.runs.values() for run in runs if run.task == POISON]
    crashes = [e for e in record.exits if not e.caused_by_harness]
    # Each process that ran the poison owes one death: two executors of one worker can start
    # both poison jobs before either kills it, and a worker the harness killed while it ran
    # the poison died of whichever SIGKILL came first (the harness's, then: it owes none).
    killed = {e.pid for e in record.exits if e.caused_by_harness}
    owed = sorted({run.pid for run in poison_runs} - killed)
    if sorted(e.pid for e in crashes) != owed or any(e.returncode != -9 for e in crashes):
        problems.append(f"{len(crashes)} worker deaths the harness did not cause "
                        f"({sorted({e.returncode for e in crashes})}); the poison ran "
                        f"{len(poison_runs)} times, in {len(owed)} processes the harness did "
                        "not kill")
    problems += [f"{e.worker_id} exited with {e.returncode}; its log ends:\n{e.log_tail}"
                 for e in crashes if e.returncode != -9]
    for restart in record.restarts:
        silent = set(restart.workers_expected) - set(restart.workers_resumed)
        if silent:
            problems.append(f"after the restart at {restart.at}: {sorted(silent)} never "
                            "finished another job")
    stuck = {w: c for w, c in record.shutdown_codes.items() if c != 0}
    if stuck:
        problems.append(f"workers that did not drain and exit 0 on SIGTERM: {stuck}")
    return _check("workers survived disconnects and restarts; only the poison killed any",
                  problems,
                  f"{len(crashes)} deaths by poison, {len(record.restarts)} restarts ridden out, "
                  f"{len(record.shutdown_codes)} workers drained and exited 0 at the end")


def flood_check(snap: Snapshot, record: RunRecord) -> tuple[Check, dict[str, Any]]:
    flood = record.flood
    ordinary = [snap.by_key[k] for k in flood.ordinary_keys if k in snap.by_key]
    problems = [f"ordinary job {j.pk} is {j.status}" for j in ordinary
                if j.status != JobStatus.SUCCEEDED]
    during = sum(1 for j in ordinary if flood.flood_ended and j.finished_at
                 and j.finished_at <= flood.flood_ended)
    last = max((j.finished_at for j in ordinary if j.finished_at), default=None)
    after = (last - flood.flood_ended).total_seconds() if last and flood.flood_ended else None
    figures = {"ordinary": len(ordinary), "flood": len(flood.flood_keys),
               "ordinary_done_during_flood": during, "last_ordinary_after_flood_s": after}
    return _check("ordinary jobs finished despite a high-priority flood", problems,
                  f"{len(flood.flood_keys)} flood jobs (priority 50) over {len(ordinary)} "
                  f"ordinary ones; {during} ordinary finished during the flood, the last "
                  f"{after if after is None else round(after, 2)}s after it"), figures


def _max(values: list[float]) -> str:
    return f"{max(values):.2f}s (median {statistics.median(values):.2f}s, n={len(values)})" \
        if values else "-"


_TAKEN = (AttemptOutcome.LEASE_EXPIRED, AttemptOutcome.TIMED_OUT, AttemptOutcome.CANCELLED,
          AttemptOutcome.LOST)


def receipts_under_the_lease(snap: Snapshot) -> Check:
    """No receipt (and its effect) was committed by a worker that no longer held the lease.

    The effect is written in the receipt's transaction; if its attempt had been taken over
    (rescued, timed out, cancelled) before the effect was even written, it committed without
    the lease.
    """
    problems = []
    for job_id, number, worker, written_at in snap.receipted_rows:
        for attempt in snap.attempts.get(job_id, []):
            if (attempt.number, attempt.worker_id) != (number, worker):
                continue
            taken_at = attempt.finished_at
            if attempt.outcome in _TAKEN and taken_at is not None and taken_at < written_at:
                problems.append(f"job {job_id}: attempt {number} on {worker} wrote its receipted "
                                f"effect at {written_at}, after it lost the lease at {taken_at}")
    return _check("no receipt committed by a worker that did not hold the lease", problems,
                  f"{len(snap.receipted_rows)} receipted effects, each by a lease holder")


def lifecycle_as_expected(snap: Snapshot, record: RunRecord) -> Check:
    """Timeouts ended the jobs that never return; cancels stuck; a paused queue gave nothing."""
    life = record.lifecycle
    problems = []
    for key in life.timed_out_keys:
        job = snap.by_key.get(key)
        outcomes = {a.outcome for a in snap.attempts.get(job.pk, [])} if job else set()
        if job is None or (job.status, job.failure_class) != ("dead", "timeout") or \
                not outcomes <= {AttemptOutcome.TIMED_OUT, AttemptOutcome.RELEASED}:
            problems.append(f"{key}: wanted dead by timeout, got "
                            f"{job.status if job else None}/{job.failure_class if job else ''} "
                            f"with attempts {sorted(outcomes)}")
    for key in life.cancelled_keys:
        # A fault may strike the handler's worker before the cancel and the job run again; once
        # the cancel is asked, no attempt may start, and the last one ends cancelled.
        job = snap.by_key.get(key)
        attempts = snap.attempts.get(job.pk, []) if job else []
        if job is not None and job.status == "cancelled" and job.cancel_requested_at is None:
            # The cancel found it waiting: a fault took its attempt back (the lease expired and
            # the rescue step retried it) before the cancel came. It ends there: no attempt
            # may start after the cancel.
            after = [a for a in attempts if a.claimed_at > job.finished_at]
            if after or job.terminal_reason != "operator":
                problems.append(f"{key}: cancelled while waiting, but {len(after)} attempts "
                                f"started after it; reason {job.terminal_reason!r}")
            continue
        asked = job.cancel_requested_at if job else None
        late = [a for a in attempts if asked is not None and a.claimed_at > asked]
        last = attempts[-1].outcome if attempts else None
        if job is None or job.status != "cancelled" or asked is None or late or \
                last not in (AttemptOutcome.CANCELLED, AttemptOutcome.LOST):
            problems.append(f"{key}: wanted cancelled with no attempt after the cancel, got "
                            f"{job.status if job else None}, {len(late)} attempts after it, "
                            f"the last {last}")
    problems += queued_as_expected(snap, record)
    claimed_while_paused = 0
    for key in life.paused_keys:
        job = snap.by_key.get(key)
        if job is None or job.status != "succeeded":
            problems.append(f"{key}: wanted succeeded after the resume, got "
                            f"{job.status if job else None}")
            continue
        for attempt in snap.attempts.get(job.pk, []):
            if life.paused_at and life.resumed_at and \
                    life.paused_at < attempt.claimed_at < life.resumed_at:
                claimed_while_paused += 1
    if claimed_while_paused:
        problems.append(f"{claimed_while_paused} claims of {life.paused_queue} while it was "
                        "paused")
    return _check("timeouts, cancels and pauses did what they say", problems,
                  f"{len(life.timed_out_keys)} handlers timed out and ended dead, "
                  f"{len(life.cancelled_keys)} running handlers cancelled for good, "
                  f"{len(life.queued_cancelled_keys)} of {len(life.queued_keys)} batched jobs "
                  "cancelled while claimed and not started, "
                  f"{len(life.paused_keys)} jobs held by a paused queue then run")


def queued_as_expected(snap: Snapshot, record: RunRecord) -> list[str]:
    """Batched jobs cancelled while they waited unstarted ended cancelled; the others ran."""
    problems = []
    cancelled = set(record.lifecycle.queued_cancelled_keys)
    for key in record.lifecycle.queued_keys:
        job = snap.by_key.get(key)
        if job is None:
            continue  # every_job_ended names it
        if key not in cancelled:
            if job.status != JobStatus.SUCCEEDED:
                problems.append(f"{key}: never cancelled, but {job.status}")
            continue
        asked = job.cancel_requested_at or job.finished_at
        attempts = snap.attempts.get(job.pk, [])
        late = [a for a in attempts if asked is not None and a.claimed_at > asked]
        # Its handler may have started between the harness's look and the cancel, and finished
        # before the cancel reached it.
        ran_first = any(run.started_at <= asked for run in snap.runs.get(job.pk, [])
                        if asked is not None)
        if late or not (job.status == JobStatus.CANCELLED
                        or (job.status == JobStatus.SUCCEEDED and ran_first)):
            problems.append(f"{key}: cancelled while claimed and not started, but "
                            f"{job.status} with {len(late)} attempts claimed after the cancel")
    return problems


def no_effect_after_worker_death(record: RunRecord) -> Check:
    """A process-isolated handler wrote nothing once its worker was dead (no orphaned child)."""
    problems, before = [], 0
    for check in record.orphans:
        if check.last_effect_id is None:
            continue  # never struck: noted by the scenario
        if check.connections_outlived_worker:
            problems.append(f"{check.key}: {check.worker_id}'s connections were still open 30 s "
                            "after it died: its child process outlived it")
        effects = Effect.objects.filter(job_id=check.job_id, worker_id=check.worker_id)
        before += effects.filter(id__lte=check.last_effect_id).count()
        late = effects.filter(id__gt=check.last_effect_id).count()
        if late:
            problems.append(f"{check.key}: {late} effects by {check.worker_id}'s attempt after "
                            "the worker was dead")
    struck = sum(1 for c in record.orphans if c.last_effect_id is not None)
    return _check("no effect of a process-isolated handler after its worker's death", problems,
                  f"{struck} workers killed while their child process wrote effects; "
                  f"{before} effects before the deaths")


def no_start_after_a_cancel(snap: Snapshot) -> tuple[Check, dict[str, int]]:
    """No handler started after its job's cancel committed (beyond the start check's freshness).

    The cancel's time is its transaction's (``cancel_requested_at``, or a waiting job's
    ``finished_at``); it committed after that. A run that started within CANCEL_START_SLACK of
    it is counted, not failed: the executor's word on cancels may be that old. So are the cancels
    that found their job claimed but not started (its cancelled attempt has no run): the ones
    that test the start check, which a run that had none did not exercise.
    """
    problems = []
    near = before_start = 0
    for job in snap.jobs.values():
        cancelled_at = job.cancel_requested_at or (
            job.finished_at if job.status == JobStatus.CANCELLED
            and job.terminal_reason == TerminalReason.OPERATOR else None)
        if cancelled_at is None:
            continue
        if job.cancel_requested_at is not None and cancelled_before_start(snap, job):
            before_start += 1
        for run in snap.runs.get(job.pk, []):
            if run.started_at <= cancelled_at:
                continue
            if run.started_at <= cancelled_at + CANCEL_START_SLACK:
                near += 1
                continue
            problems.append(f"job {job.pk}: attempt {run.attempt} on {run.worker_id} started "
                            f"{(run.started_at - cancelled_at).total_seconds():.3f}s after its "
                            "cancel")
    exercised = (f"{before_start} cancels reached a claimed job before its handler started"
                 if before_start else "no cancel reached a claimed job before its handler "
                 "started: the start check was not exercised")
    return _check("no handler started after its job's cancel", problems,
                  f"{sum(1 for j in snap.jobs.values() if j.cancel_requested_at)} running jobs "
                  f"cancelled; {exercised}; {near} handlers started within the start check's "
                  f"{START_CANCEL_FRESH_SECONDS:g}s freshness of a cancel, none later"
                  if not problems else f"{exercised}; {near} within the freshness"), {
                      "near": near, "before_start": before_start}


def cancelled_before_start(snap: Snapshot, job: Job) -> bool:
    """Whether ``job``'s cancel ended an attempt whose handler never started (no ``Run``)."""
    ended = [a for a in snap.attempts.get(job.pk, []) if a.outcome == AttemptOutcome.CANCELLED]
    started = {run.lease_token for run in snap.runs.get(job.pk, [])}
    return bool(ended) and ended[-1].lease_token not in started


def attempt_history_kept(snap: Snapshot) -> tuple[Check, int]:
    """An attempt's recorded outcome is never overwritten by a later stale report.

    Every attempt that lost its lease was ended by the rescue step or its worker, which wrote its
    row; a late report is kept beside that outcome (``reported_outcome``). A ``lost`` row would be
    a record replaced, or a report about a lease that nothing ended.
    """
    problems = []
    beside = 0
    for job_id, attempts in snap.attempts.items():
        for a in attempts:
            if a.outcome == AttemptOutcome.LOST:
                problems.append(f"job {job_id}: attempt {a.number} on {a.worker_id} is recorded "
                                f"lost (reported {a.reported_outcome}, class "
                                f"{a.failure_class or '-'}), not as what ended it")
            elif a.outcome in _TAKEN and a.reported_outcome not in ("", a.outcome):
                beside += 1
                if a.outcome == AttemptOutcome.TIMED_OUT and \
                        a.failure_class != FailureClass.TIMEOUT:
                    problems.append(f"job {job_id}: attempt {a.number} timed out with class "
                                    f"{a.failure_class}")
    return _check("every attempt keeps the outcome that ended it", problems,
                  f"{beside} reports kept beside the outcome of an attempt already ended; "
                  "none recorded over it" if not problems else f"{beside} kept beside"), beside


def attempt_counts_agree(snap: Snapshot) -> Check:
    """A job that ended has as many attempts as its attempt rows that count one."""
    problems = []
    ended = 0
    for job in snap.jobs.values():
        if job.status not in TERMINAL:
            continue
        ended += 1
        rows = snap.attempts.get(job.pk, [])
        counted = sum(counts_an_attempt(a) for a in rows)
        if job.attempts != counted:
            problems.append(f"job {job.pk} ({job.status}): attempts is {job.attempts}, its rows "
                            f"count {counted} ({', '.join(a.outcome for a in rows)})")
    return _check("an ended job's attempts equal its counted attempt rows", problems,
                  f"{ended} ended jobs, every count matching its rows")


def schedule_counters_match_jobs(snap: Snapshot, record: RunRecord) -> Check:
    """Each schedule's ``ticks_enqueued`` is the number of jobs that name it.

    Every job of a schedule comes from its ticks (the harness never runs one now), and jobs are
    not pruned during a run: an operator's edit saved while a worker enqueued ticks must not
    write an older count, or an older cursor that enqueues a tick twice, over the worker's.
    """
    problems = []
    jobs: Counter[int] = Counter(j.schedule_id for j in snap.jobs.values() if j.schedule_id)
    for schedule in snap.schedules:
        if schedule.ticks_enqueued != jobs[schedule.pk]:
            problems.append(f"{schedule.name}: ticks_enqueued is {schedule.ticks_enqueued}, "
                            f"{jobs[schedule.pk]} jobs name it")
    edits = record.schedules
    return _check("each schedule counted the jobs it enqueued", problems,
                  f"{len(snap.schedules)} schedules, {sum(jobs.values())} jobs of their ticks; "
                  f"{sum(edits.edits.values())} operator edits {edits.edits}, "
                  f"{edits.saved_over_a_tick} saved over a tick enqueued since they read")


def skip_schedule_runs_one_job_at_a_time(snap: Snapshot) -> Check:
    """An overlap ``skip`` schedule never had two of its jobs running at once.

    A job runs from its first claim to the end of its last attempt (an open one: until now).
    """
    problems = []
    compared = 0
    for schedule in snap.schedules:
        if schedule.overlap != OverlapPolicy.SKIP:
            continue
        spans = []
        for job in snap.jobs.values():
            attempts = snap.attempts.get(job.pk, [])
            if job.schedule_id != schedule.pk or not attempts:
                continue
            spans.append((attempts[0].claimed_at,
                          max(a.finished_at or snap.now for a in attempts), job.pk))
        spans.sort()
        for (_, end_a, job_a), (start_b, _, job_b) in pairwise(spans):
            compared += 1
            if start_b < end_a:
                problems.append(f"{schedule.name}: job {job_b} was claimed "
                                f"{(end_a - start_b).total_seconds():.2f}s before job {job_a} "
                                "ended")
    return _check("an overlap-skip schedule ran one job at a time", problems,
                  f"{compared} consecutive jobs of skip schedules compared, none overlapping"
                  if not problems else f"{compared} compared")


def limits_never_exceeded(snap: Snapshot) -> tuple[Check, dict[str, Any]]:
    """At no instant did more attempts of one limit key run than its limit, by the attempts'
    own windows (claim to end; a rescued attempt ends when its lease was taken back)."""
    windows: dict[str, list[tuple[datetime, datetime]]] = defaultdict(list)
    for job_id, attempts in snap.attempts.items():
        job = snap.jobs[job_id]
        if job.task != LIMITED:
            continue
        for attempt in attempts:
            windows[job.limit_key or "-"].append((attempt.claimed_at,
                                                  attempt.finished_at or snap.now))
    most = {}
    for key, spans in windows.items():
        # Ends before starts at the same instant: a run that ended as the next began is not two.
        events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
        running = peak = 0
        for _, step in events:
            running += step
            peak = max(peak, running)
        most[key] = peak
    problems = [f"{key}: {peak} attempts ran at once, over its limit of {LIMITED_RUNNING}"
                for key, peak in sorted(most.items()) if peak > LIMITED_RUNNING]
    limited_jobs = sum(1 for j in snap.jobs.values() if j.task == LIMITED)
    summary = (f"{limited_jobs} jobs under a limit of {LIMITED_RUNNING} per key, "
               f"{sum(len(s) for s in windows.values())} attempts on {len(windows)} keys; most "
               f"at once: {', '.join(f'{k} {v}' for k, v in sorted(most.items())) or 'none'}")
    if limited_jobs == 0:
        problems.append("no job under a limit ran: the check checked nothing")
    return _check("no limit key ever ran more attempts at once than its limit", problems,
                  summary), {"jobs": limited_jobs, "most_at_once": dict(sorted(most.items()))}


def rates_never_exceeded(snap: Snapshot) -> tuple[Check, dict[str, Any]]:
    """Every start of a rate key's attempts (each claim, rescued or not) was one its rate
    allowed: the generic cell rate algorithm, replayed over the recorded claim times."""
    starts: dict[str, list[datetime]] = defaultdict(list)
    for job_id, attempts in snap.attempts.items():
        job = snap.jobs[job_id]
        if job.task == RATED:
            starts[job.limit_key or "-"] += [a.claimed_at for a in attempts]
    interval = timedelta(seconds=1 / RATED_PER_SECOND)
    problems = []
    for key, times in sorted(starts.items()):
        tat: datetime | None = None
        for at in sorted(times):
            allowed = None if tat is None else tat + interval - RATED_BURST * interval
            if allowed is not None and at < allowed:
                early = (allowed - at).total_seconds()
                problems.append(f"{key}: a start at {at.isoformat()} came {early:.3f}s before "
                                "its rate allowed")
            tat = max(tat or at, at) + interval
    rated_jobs = sum(1 for j in snap.jobs.values() if j.task == RATED)
    if rated_jobs == 0:
        problems.append("no job under a rate ran: the check checked nothing")
    summary = (f"{rated_jobs} jobs under a rate of {RATED_PER_SECOND}/s (burst {RATED_BURST}) "
               f"per key, {sum(len(t) for t in starts.values())} starts on {len(starts)} keys, "
               "each one its rate allowed")
    return _check("no rate key ever started more than its rate allowed", problems[:10],
                  summary), {"jobs": rated_jobs,
                             "starts": {k: len(v) for k, v in sorted(starts.items())}}


def _met(requires: str, status: str) -> bool:
    if requires == "finished":
        return status in TERMINAL
    if requires == "succeeded":
        return status == JobStatus.SUCCEEDED
    return status in (JobStatus.DEAD, JobStatus.CANCELLED)


def dependents_waited(snap: Snapshot, record: RunRecord) -> tuple[Check, dict[str, Any]]:
    """No job started before every job it depends on had ended as its edge requires; one
    cancelled for a dependency had an edge that could no longer be met."""
    problems = []
    edges: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for job_id, upstream, requires in Dependency.objects.values_list(
            "job_id", "upstream_id", "requires"):
        edges[job_id].append((upstream, requires))
    started = cancelled = 0
    for job_id, ups in edges.items():
        job = snap.jobs.get(job_id)
        if job is None:
            problems.append(f"edges of job {job_id}, which does not exist")
            continue
        claims = [a.claimed_at for a in snap.attempts.get(job_id, [])]
        if claims:
            started += 1
            first = min(claims)
            for upstream, requires in ups:
                up = snap.jobs[upstream]
                if not _met(requires, up.status) or up.finished_at is None:
                    problems.append(f"job {job_id} started though job {upstream} is {up.status} "
                                    f"(its edge requires {requires})")
                elif first < up.finished_at:
                    problems.append(f"job {job_id} started at {first}, before job {upstream} "
                                    f"ended at {up.finished_at}")
        elif job.terminal_reason == TerminalReason.DEPENDENCY:
            cancelled += 1
            if all(_met(r, snap.jobs[u].status) for u, r in ups):
                problems.append(f"job {job_id} was cancelled for a dependency, but every edge "
                                "was met")
    summary = (f"{len(edges)} jobs with dependencies ({sum(map(len, edges.values()))} edges): "
               f"{started} started after their dependencies, {cancelled} cancelled for one")
    if record.workflow_keys and started == 0:
        problems.append("no job with dependencies started: the check checked nothing")
    return _check("no dependent started before its dependencies ended as its edges require",
                  problems, summary), {"dependents": len(edges), "started": started,
                                       "cancelled": cancelled}


def callbacks_once(snap: Snapshot, record: RunRecord) -> Check:
    """Every chord's callback exists once, ended, and its receipted effect happened once."""
    problems = []
    ran = 0
    for key in record.callback_keys:
        job = snap.by_key.get(key)
        if job is None:
            problems.append(f"callback {key} was never enqueued")
            continue
        effects = snap.receipted_effects[key]
        if job.status == JobStatus.SUCCEEDED:
            ran += 1
            if effects != 1:
                problems.append(f"callback {key} ({job.pk}) ran its effect {effects} times")
        elif job.terminal_reason != TerminalReason.DEPENDENCY:
            problems.append(f"callback {key} ({job.pk}) is {job.status}, not succeeded or "
                            "cancelled for a dependency")
    if record.callback_keys and ran == 0:
        problems.append("no callback ran: the check checked nothing")
    return _check("every fan-in callback ran exactly once", problems,
                  f"{len(record.callback_keys)} chord callbacks, {ran} ran, each effect once")


def check_all(record: RunRecord, lease_seconds: float) -> tuple[list[Check], dict[str, Any]]:
    """Run every check; return them and the run's figures."""
    snap = Snapshot.load()
    plain_check, plain = unreceipted_duplicates(snap)
    flood, flood_figures = flood_check(snap, record)
    cancel_start, cancel_figures = no_start_after_a_cancel(snap)
    history, kept_beside = attempt_history_kept(snap)
    limits, limit_figures = limits_never_exceeded(snap)
    rates, rate_figures = rates_never_exceeded(snap)
    waited, workflow_figures = dependents_waited(snap, record)
    checks = [
        every_job_ended(snap, record),
        leases_never_overlap(snap),
        runs_never_overlap(snap),
        no_stale_settlement(snap),
        receipted_effects_once(snap),
        plain_check,
        poison_dead(snap, record),
        targets_as_expected(snap, record),
        recovery_bounded(snap, record, lease_seconds),
        replays_deduplicated(snap, record),
        workers_held_up(snap, record),
        flood,
        receipts_under_the_lease(snap),
        lifecycle_as_expected(snap, record),
        no_effect_after_worker_death(record),
        cancel_start,
        history,
        attempt_counts_agree(snap),
        schedule_counters_match_jobs(snap, record),
        skip_schedule_runs_one_job_at_a_time(snap),
        limits,
        rates,
        waited,
        callbacks_once(snap, record),
    ]
    statuses = Counter(j.status for j in snap.jobs.values())
    outcomes = Counter(a.outcome for rows in snap.attempts.values() for a in rows)
    faults = Counter(f"{f.kind}/{'random' if f.origin == 'random' else 'targeted'}"
                     for f in record.faults)
    found = recoveries(snap, record)
    figures = {
        "jobs": len(snap.jobs),
        "jobs_by_status": dict(sorted(statuses.items())),
        "jobs_lost": len(every_job_ended(snap, record).problems),
        "attempts": sum(outcomes.values()),
        "attempts_by_outcome": dict(sorted(outcomes.items())),
        "faults": dict(sorted(faults.items())),
        "kills": sum(n for k, n in faults.items() if k.startswith("kill/")),
        "poison_kills": sum(not e.caused_by_harness for e in record.exits),
        "stops": sum(n for k, n in faults.items() if k.startswith("stop/")),
        "disconnects": sum(n for k, n in faults.items() if k.startswith("disconnect/")),
        "restarts": len(record.restarts),
        "worker_processes": len(record.exits) + len(record.shutdown_codes),
        "receipted_effects": sum(snap.receipted_effects.values()),
        "receipted_duplicates": sum(n - 1 for n in snap.receipted_effects.values() if n > 1),
        "plain": plain,
        "late_reports_lost": outcomes.get(AttemptOutcome.LOST, 0),
        "late_reports_kept_beside": kept_beside,
        "handlers_started_within_cancel_freshness": cancel_figures["near"],
        "cancels_before_start": cancel_figures["before_start"],
        "queued_cancelled": sum(snap.by_key[k].status == JobStatus.CANCELLED
                                for k in record.lifecycle.queued_cancelled_keys
                                if k in snap.by_key),
        "late_reports_by_reported_outcome": dict(Counter(
            a.reported_outcome for rows in snap.attempts.values() for a in rows
            if a.outcome == AttemptOutcome.LOST)),
        "recovery_targeted_max_s": max(found["targeted"], default=None),
        "recovery_bystanders_rescued_max_s": max(found["bystanders_rescued"], default=None),
        "recovery_bystanders_reclaimed_max_s": max(found["bystanders_reclaimed"], default=None),
        "recovery_bystanders_reclaimed_median_s": statistics.median(
            found["bystanders_reclaimed"]) if found["bystanders_reclaimed"] else None,
        "recovery_bound_s": recovery_bound_seconds(lease_seconds),
        "flood": flood_figures,
        "limits": limit_figures,
        "rates": rate_figures,
        "workflows": workflow_figures,
        "replayed_enqueues": sum(len(v) for v in record.replays.calls.values()),
        "targets": {t.key: target_observed(snap, t) for t in record.targets},
        "wall_seconds": record.wall_seconds,
    }
    return checks, figures
