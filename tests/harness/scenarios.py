"""The workload and the faults: what the harness does to a pool of real workers."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.db import connection
from django.db.models import Exists, F, OuterRef, Q
from django.db.models.functions import Now

import django_pgjobs
from django_pgjobs import schedules, transitions
from django_pgjobs.conf import settings
from django_pgjobs.enqueuing import JobSpec
from django_pgjobs.models import Attempt, Job, Schedule
from django_pgjobs.status import JobStatus
from django_pgjobs.workflows import After
from testproject.chaos.models import Effect, Run
from tests.harness import db
from tests.harness.pool import Member, WorkerPool
from tests.harness.records import (
    LIMITED,
    PLAIN,
    POISON,
    QUEUED,
    RATED,
    RECEIPTED,
    SCHEDULED,
    TICK,
    Fault,
    OrphanCheck,
    Replays,
    Restart,
    RunRecord,
    Target,
)
from tests.harness.server import PrivateServer

# Targets and the poison jump the queue, so their recovery is not queueing behind bulk work.
TARGET_PRIORITY = 90
FLOOD_PRIORITY = 50
# Shorter than the 2 s lease of the chaos handlers: the harness strikes while the job holds.
HOLD_SECONDS = 1.5
OUTAGE_SECONDS = 1.5

# (name, fault, task, hold point)
TARGETS = [
    ("kill_before_effect/plain", "kill", PLAIN, "before_effect"),
    ("kill_after_effect/plain", "kill", PLAIN, "after_effect"),
    ("kill_after_effect/receipted", "kill", RECEIPTED, "after_effect"),
    ("stop_until_takeover/plain", "stop", PLAIN, "before_effect"),
    ("stop_until_takeover/receipted", "stop", RECEIPTED, "before_effect"),
    ("disconnect/plain", "disconnect", PLAIN, "before_effect"),
]


@dataclass
class Context:
    pool: WorkerPool
    server: PrivateServer
    record: RunRecord
    rng: random.Random
    lease_seconds: float


def running_jobs(worker_id: str) -> list[int]:
    """Jobs with a running attempt held by ``worker_id``."""
    return db.retrying(lambda: list(
        Job.objects.filter(status=JobStatus.RUNNING, lease_owner=worker_id)
        .values_list("id", flat=True)
    ))


def job_status(job_id: int) -> str:
    return db.retrying(lambda: Job.objects.values_list("status", flat=True).get(pk=job_id))


def worker_finished_a_job_since(worker_id: str, since: Any) -> bool:
    # A success has no attempt row: its job keeps its worker (Job.success_attempt).
    return db.retrying(lambda: Job.objects.filter(
        lease_owner=worker_id, claimed_at__gt=since, status=JobStatus.SUCCEEDED
    ).exists())


# --- workload ---------------------------------------------------------------------------------


class SnapshotHolder(threading.Thread):
    """Holds a REPEATABLE READ snapshot open on the workers' database until halted, as a long
    report would, taking it again after each restart of the server; vacuum's horizon stays
    back and the workers claim from floors."""

    def __init__(self, url: str, logs: Path) -> None:
        super().__init__(name="harness-snapshot", daemon=True)
        self.url = url
        self.logs = logs
        self.halt = threading.Event()
        self.held_seconds = 0.0

    def run(self) -> None:
        import psycopg

        while not self.halt.is_set():
            try:
                with psycopg.connect(self.url, application_name="harness-snapshot") as conn:
                    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                    conn.execute("SELECT count(*) FROM pgjobs_job").fetchone()
                    while not self.halt.wait(0.5):
                        conn.execute("SELECT 1").fetchone()  # fails once the server is gone
                        self.held_seconds += 0.5
                    conn.rollback()
            except psycopg.Error:
                self.halt.wait(0.5)

    def problems(self) -> list[str]:
        """What says the run did not test claims from floors."""
        if self.held_seconds < 5:
            return [f"the snapshot was held only {self.held_seconds:.1f}s"]
        said = [p.name for p in self.logs.glob("*.log")
                if "worker.claim_floors on" in p.read_text(errors="replace")]
        return [] if said else ["no worker said it claimed from floors"]


class Feeder(threading.Thread):
    """Enqueues bulk effect jobs (half plain, half receipted) at a steady rate until stopped."""

    def __init__(self, record: RunRecord, rate_per_second: float, limit: int, seed: int) -> None:
        super().__init__(name="harness-feeder", daemon=True)
        self.record = record
        self.rate = rate_per_second
        self.limit = limit
        self.rng = random.Random(seed)
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            step = 0.25
            n = step_no = 0
            while not self.halt.is_set() and n < self.limit:
                size = min(max(1, round(self.rate * step)), self.limit - n)
                keys = [f"bulk:{i}" for i in range(n, n + size)]
                specs = [
                    JobSpec.of(
                        PLAIN if i % 2 == 0 else RECEIPTED,
                        {"key": key, "work_seconds": self.rng.uniform(0.02, 0.25)},
                        idempotency_key=key,
                    )
                    for i, key in zip(range(n, n + size), keys, strict=True)
                ]
                # Every fourth also a job under a limit of two per group, three groups.
                limited = [f"limited:{i}" for i in range(n, n + size) if i % 4 == 0]
                specs += [JobSpec.of(LIMITED, {"group": f"g{int(key[8:]) % 3}",
                                               "work_seconds": self.rng.uniform(0.05, 0.3)},
                                     idempotency_key=key) for key in limited]
                # And every fourth, two on, a job under a rate of five a second per group.
                rated = [f"rated:{i}" for i in range(n, n + size) if i % 4 == 2]
                specs += [JobSpec.of(RATED, {"group": f"g{int(key[6:]) // 4 % 2}",
                                             "work_seconds": self.rng.uniform(0.05, 0.3)},
                                     idempotency_key=key) for key in rated]
                limited += rated
                # Every other step, a chord of three (its callback receipted) and a chain of
                # three, in the same call: workflows among the jobs the faults hit.
                workflow: list[str] = []
                if step_no % 2 == 0:
                    specs += self.workflow(step_no, workflow)
                db.retrying(lambda specs=specs: django_pgjobs.enqueue_many(specs))
                self.record.workflow_keys.extend(workflow)
                self.record.callback_keys.extend(k for k in workflow if k.startswith("wf:cb:"))
                step_no += 1
                self.record.bulk_keys.extend(keys)
                self.record.limited_keys.extend(limited)
                n += size
                self.halt.wait(step)
        except BaseException as exc:  # reported by the runner; a feeder must not die silently
            self.error = exc
        finally:
            db.reconnect()

    def workflow(self, n: int, keys: list[str]) -> list[JobSpec]:
        """A chord of three effect jobs whose callback is receipted, and a chain of three, each
        job under an idempotency key (a retried enqueue dedupes, workflow and all)."""

        def spec(task: str, key: str, after: list[Any] | None = None) -> JobSpec:
            keys.append(key)
            return JobSpec.of(task, {"key": key, "work_seconds": self.rng.uniform(0.02, 0.2)},
                              idempotency_key=key, after=after or [])

        members = [spec(PLAIN if m % 2 else RECEIPTED, f"wf:chord:{n}:{m}") for m in range(3)]
        callback = spec(RECEIPTED, f"wf:cb:{n}", members)
        links = [spec(PLAIN, f"wf:chain:{n}:0")]
        for s in (1, 2):
            links.append(spec(RECEIPTED if s == 2 else PLAIN, f"wf:chain:{n}:{s}",
                              [After(links[-1], "finished")]))
        return [*members, callback, *links]


# Two expressions an edit switches between: every second, every two seconds.
EVERY_SECOND = "* * * * * *"
EVERY_TWO_SECONDS = "*/2 * * * * *"
# (name, overlap policy, work seconds): the skip schedules' jobs outlast their ticks.
SCHEDULES = [
    ("harness:allow", "allow", 0.3),
    ("harness:skip", "skip", 1.0),
    ("harness:skip-slow", "skip", 1.5),
]
EDITOR = transitions.Actor("harness-editor")


def create_schedules(record: RunRecord) -> list[int]:
    """The operators' schedules the editor works on, created as the admin creates them."""
    ids = []
    for name, overlap, work_seconds in SCHEDULES:
        row = Schedule(name=name, task=SCHEDULED, cron=EVERY_SECOND, overlap=overlap,
                       payload={"work_seconds": work_seconds})
        db.retrying(lambda row=row: schedules.save_schedule(row, created=True, actor=EDITOR))
        ids.append(row.pk)
        record.schedules.names.append(name)
    return ids


def _new_payload(row: Schedule, rng: random.Random) -> None:
    row.payload = {**row.payload, "edit": rng.randrange(10**6)}


def _other_cron(row: Schedule, rng: random.Random) -> None:
    row.cron = EVERY_TWO_SECONDS if row.cron == EVERY_SECOND else EVERY_SECOND


# What an edit changes on the form; a pause or resume is an admin action of its own.
EDITS = {"payload": _new_payload, "cron": _other_cron}
EDIT_WEIGHTS = {"payload": 3, "cron": 2, "pause": 1}


class ScheduleEditor(threading.Thread):
    """Edits schedules the way an operator does in the admin while the workers tick them.

    An edit is one admin request: read the row and its definition, think a moment (so ticks land
    in between), save through ``schedules.save_schedule`` with the definition as read. A pause
    and the resume a moment later go through the admin's actions. It creates its schedules when
    it starts.
    """

    def __init__(self, record: RunRecord, seed: int,
                 think: tuple[float, float] = (0.3, 1.2)) -> None:
        super().__init__(name="harness-schedule-editor", daemon=True)
        self.record = record
        self.ids: list[int] = []
        self.rng = random.Random(seed)
        self.think = think
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.ids = create_schedules(self.record)
            while not self.halt.is_set():
                schedule_id = self.rng.choice(self.ids)
                kind = self.rng.choices(list(EDIT_WEIGHTS), list(EDIT_WEIGHTS.values()))[0]
                db.retrying(lambda schedule_id=schedule_id, kind=kind: self._edit(schedule_id,
                                                                                   kind))
                edits = self.record.schedules.edits
                edits[kind] = edits.get(kind, 0) + 1
                self.halt.wait(self.rng.uniform(0.05, 0.3))
        except BaseException as exc:  # reported by the runner, like the feeder's
            self.error = exc
        finally:
            db.reconnect()

    def _edit(self, schedule_id: int, kind: str) -> None:
        if kind == "pause":
            schedules.pause_schedules([schedule_id], actor=EDITOR, reason="harness")
            time.sleep(self.rng.uniform(*self.think))
            schedules.resume_schedules([schedule_id], actor=EDITOR, reason="harness")
            return
        row = Schedule.objects.get(pk=schedule_id)
        before = {f: getattr(row, f) for f in schedules.DEFINITION}
        EDITS[kind](row, self.rng)
        time.sleep(self.rng.uniform(*self.think))
        enqueued = Schedule.objects.values_list("ticks_enqueued", flat=True).get(pk=schedule_id)
        if enqueued != row.ticks_enqueued:
            self.record.schedules.saved_over_a_tick += 1
        schedules.save_schedule(row, created=False, before=before, actor=EDITOR)


def stop_schedules(editor: ScheduleEditor) -> None:
    """Stop the editor, then pause its schedules so the run can drain."""
    editor.halt.set()
    editor.join(60)
    if editor.error is not None:
        editor.record.notes.append(f"the schedule editor failed: {editor.error!r}")
    db.retrying(lambda: schedules.pause_schedules(editor.ids, actor=EDITOR, reason="harness"))


def enqueue_later(record: RunRecord, count: int) -> None:
    """Jobs due in an hour: at the end they are legitimately waiting, not lost."""
    for i in range(count):
        key = f"later:{i}"
        db.enqueue(TICK, key, {}, delay=3600)
        record.later_keys.append(key)


def replay_enqueues(
    record: RunRecord, rng: random.Random, keys: list[str], per_key: int, threads: int
) -> None:
    """Enqueue each key ``per_key`` times from ``threads`` threads at once."""
    calls = [key for key in keys for _ in range(per_key)]
    rng.shuffle(calls)
    lock = threading.Lock()
    start = threading.Barrier(threads)
    replays: Replays = record.replays

    def work(chunk: list[str]) -> None:
        try:
            start.wait(30)
            for key in chunk:
                job = db.enqueue(RECEIPTED, key, {"key": key})
                with lock:
                    replays.calls.setdefault(key, []).append((job.pk, bool(job.created)))
        finally:
            db.reconnect()

    pool = [threading.Thread(target=work, args=(calls[i::threads],)) for i in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(120)


def drain(timeout: float) -> bool:
    """Wait until no job is ready, running, waiting on a limit or a rate, or due soon; True if
    that happened in time. (A rate's next job waits throttled for its turn while nothing is
    ready or running: the queue is not quiet then.)

    A retry whose backoff ends a moment after the check would be due by the time the workers
    are stopped and the invariants read the jobs: it counts as due until it is past the backoff
    cap and the promote step's poll, far from the jobs that wait an hour on purpose.
    """
    soon = timedelta(seconds=float(settings.RETRY_MAX_SECONDS)
                     + 2 * float(settings.POLL_INTERVAL_SECONDS))

    def quiet() -> bool:
        return not Job.objects.filter(
            Q(status__in=[JobStatus.READY, JobStatus.RUNNING, JobStatus.THROTTLED])
            | Q(status__in=[JobStatus.SCHEDULED, JobStatus.RETRYING], run_at__lte=Now() + soon)
        ).exists()

    return bool(db.wait_until(quiet, timeout, interval=0.2))


# --- targeted faults --------------------------------------------------------------------------


def run_target(ctx: Context, name: str, fault: str, task: str, hold: str, round_no: int) -> None:
    """Hold one job still at ``hold``, strike its worker with ``fault``, follow it to the end."""
    key = f"target:{round_no}:{name}"
    job = db.enqueue(
        task, key, {"key": key, "hold": hold, "hold_seconds": HOLD_SECONDS},
        priority=TARGET_PRIORITY,
    )
    target = Target(name, fault, task, hold, key, job.pk)
    ctx.record.targets.append(target)
    run = db.wait_until(
        lambda: Run.objects.filter(job_id=job.pk, attempt=1, stage=Run.Stage.HOLDING).first(), 30
    )
    member = ctx.pool.by_pid(run.pid) if run is not None else None
    if run is None or member is None or not member.alive():
        ctx.record.notes.append(f"{key}: the job never held on a live worker; fault not injected")
        return
    target.worker_id, target.at = member.worker_id, db.db_now()
    record = Fault(fault, name, target.at, member.worker_id, running_jobs(member.worker_id))
    ctx.record.faults.append(record)
    if fault == "kill":
        ctx.pool.kill(member)
    elif fault == "stop":
        ctx.pool.stop(member)
    else:
        record.detail = f"{db.terminate_backends(member.worker_id)} connections terminated"
    # The handler writes "finished" as its last step: still holding means the fault landed
    # before the job's effect could complete on this attempt.
    target.struck = db.retrying(
        lambda: Run.objects.filter(pk=run.pk, stage=Run.Stage.HOLDING).exists()
    )
    done = db.wait_until(lambda: job_status(job.pk) == JobStatus.SUCCEEDED, 30)
    if fault == "stop":
        target.resumed_after_takeover = bool(done)
        ctx.pool.resume(member)
        # Its late report is recorded lost, or beside the rescue's record of its attempt.
        lost = db.wait_until(lambda: Attempt.objects.filter(lease_token=run.lease_token)
            .exclude(reported_outcome="").exclude(reported_outcome=F("outcome")).exists(), 30)
        if not lost:
            ctx.record.notes.append(f"{key}: the resumed worker's late report never arrived")
    elif fault == "disconnect":
        target.worker_went_on = bool(db.wait_until(
            lambda: worker_finished_a_job_since(member.worker_id, target.at), 30))
    if not done:
        ctx.record.notes.append(f"{key}: not succeeded within 30 s of the fault")


def run_targets(ctx: Context, round_no: int) -> None:
    for name, fault, task, hold in TARGETS:
        run_target(ctx, name, fault, task, hold, round_no)


# --- database restart, poison, flood ----------------------------------------------------------


def restart_database(ctx: Context, origin: str) -> None:
    """Crash and restart the server mid-run; every worker must reconnect and go on."""
    before = [m.worker_id for m in ctx.pool.running()]
    at = db.db_now()
    interrupted = db.retrying(lambda: list(
        Job.objects.filter(status=JobStatus.RUNNING).values_list("id", flat=True)
    ))
    db.reconnect()
    down = ctx.server.restart(OUTAGE_SECONDS)
    ctx.record.faults.append(Fault("restart", origin, at, "", interrupted,
                                   f"down {down:.1f}s"))
    restart = Restart(at, down, before)
    ctx.record.restarts.append(restart)
    back = db.db_now()

    def resumed() -> list[str]:
        alive = {m.worker_id for m in ctx.pool.running()}
        return [w for w in before if w in alive and worker_finished_a_job_since(w, back)]

    def all_resumed() -> bool:
        alive = {m.worker_id for m in ctx.pool.running()}
        return set(resumed()) >= {w for w in before if w in alive}

    db.wait_until(all_resumed, 45, interval=0.2)
    restart.workers_resumed = resumed()
    alive = {m.worker_id for m in ctx.pool.running()}
    restart.workers_expected = [w for w in before if w in alive]


def poison_and_flood(ctx: Context, ordinary: int, flood_seconds: float, flood_rate: float,
                     poison_jobs: int) -> None:
    """Poison jobs kill workers while a high-priority flood sits on top of ordinary jobs.

    The flood arrives faster than the workers drain it, so a backlog of high-priority jobs
    builds up in front of the ordinary ones enqueued just after its first second.
    """
    flood = ctx.record.flood
    flood.flood_started = db.db_now()
    for i in range(poison_jobs):
        key = f"poison:{len(flood.poison_keys) + i}"
        db.enqueue(POISON, key, {}, priority=TARGET_PRIORITY)
        flood.poison_keys.append(key)
    step = 0.25
    started = time.monotonic()
    n = len(flood.flood_keys)
    while time.monotonic() < started + flood_seconds:
        keys = [f"flood:{i}" for i in range(n, n + max(1, round(flood_rate * step)))]
        db.retrying(lambda keys=keys: django_pgjobs.enqueue_many([
            JobSpec.of(TICK, {"work_seconds": 0.05}, idempotency_key=key,
                       priority=FLOOD_PRIORITY)
            for key in keys
        ]))
        flood.flood_keys.extend(keys)
        n += len(keys)
        if not flood.ordinary_keys and time.monotonic() >= started + 1.0:
            keys = [f"ordinary:{i}" for i in range(ordinary)]
            db.retrying(lambda keys=keys: django_pgjobs.enqueue_many([
                JobSpec.of(TICK, {"work_seconds": 0.01}, idempotency_key=key) for key in keys
            ]))
            flood.ordinary_keys = keys
        time.sleep(step)
    flood.flood_ended = db.db_now()
    keys = flood.poison_keys + flood.flood_keys + flood.ordinary_keys
    if not db.wait_until(lambda: not Job.objects.filter(idempotency_key__in=keys).exclude(
            status__in=[JobStatus.SUCCEEDED, JobStatus.DEAD]).exists(), 120, interval=0.2):
        ctx.record.notes.append("poison/flood: not every job ended within 120 s")


# --- lifecycle controls -----------------------------------------------------------------------

TIMEOUT_TASKS = ["chaos.forever_process", "chaos.forever"]
CANCEL_TASKS = ["chaos.until_cancelled", "chaos.cancel_heartbeat", "chaos.cancel_process",
                "chaos.cancel_async"]
PAUSED_QUEUE = "harness-paused"
PAUSE_SECONDS = 2.0


def lifecycle_controls(ctx: Context) -> None:
    """Handlers that never return and must time out, cancels of running handlers of every kind,
    and a queue paused while jobs arrive on it, all while the workers keep being struck."""
    life = ctx.record.lifecycle
    for i, task in enumerate(TIMEOUT_TASKS):
        key = f"timeout:{i}"
        db.enqueue(task, key, {}, priority=TARGET_PRIORITY)
        life.timed_out_keys.append(key)
    def holding(job_id: int) -> bool:
        return Run.objects.filter(job_id=job_id, stage=Run.Stage.HOLDING).exists()

    # One at a time: claimed in one batch, the second would wait behind the first, which never
    # returns, until the lease left to it is too short to start (half of chaos.jobs.LONG_LEASE,
    # 30 s). A worker killed after claiming one, before its handler started, holds it for the
    # whole long lease (60 s) until the rescue step frees it.
    cancels = {}
    for i, task in enumerate(CANCEL_TASKS):
        key = f"cancel:{i}"
        job_id = db.enqueue(task, key, {}, priority=TARGET_PRIORITY).pk
        cancels[key] = (task, job_id)
        life.cancelled_keys.append(key)
        if not db.wait_until(lambda job_id=job_id: holding(job_id), 90):
            ctx.record.notes.append(f"{key}: {task} never ran before its cancel")
    db.retrying(lambda: transitions.cancel_jobs([job_id for _, job_id in cancels.values()],
                                                reason="harness"))

    life.paused_queue = PAUSED_QUEUE
    db.retrying(lambda: transitions.pause_queue(PAUSED_QUEUE, reason="harness"))
    life.paused_at = db.db_now()
    for i in range(20):
        key = f"paused:{i}"
        db.enqueue(TICK, key, {}, queue=PAUSED_QUEUE)
        life.paused_keys.append(key)
    time.sleep(PAUSE_SECONDS)
    life.resumed_at = db.db_now()
    db.retrying(lambda: transitions.resume_queue(PAUSED_QUEUE, reason="harness"))
    keys = life.timed_out_keys + life.cancelled_keys + life.paused_keys
    if not db.wait_until(lambda: not Job.objects.filter(idempotency_key__in=keys).exclude(
            status__in=[JobStatus.SUCCEEDED, JobStatus.DEAD, JobStatus.CANCELLED]).exists(),
            90, interval=0.2):
        ctx.record.notes.append("lifecycle: not every job ended within 90 s")


# --- cancels of claimed jobs whose handlers have not started ---------------------------------

QUEUED_JOBS = 10  # two batches of the workers' five
QUEUED_WORK_SECONDS = 0.5


def cancel_before_start(ctx: Context) -> None:
    """Cancel jobs an executor claimed in a batch but has not started yet.

    The batch's jobs run one after another, each for half a second, so those behind the first
    wait in the worker, claimed (running, their attempt open) but with no ``Run`` row. Every
    other one of them is cancelled while it waits: its worker must settle it cancelled, at its
    start check or from its waiting list, and never start its handler.
    """
    life = ctx.record.lifecycle
    keys = [f"queued:{i}" for i in range(QUEUED_JOBS)]
    db.retrying(lambda: django_pgjobs.enqueue_many([
        JobSpec.of(QUEUED, {"work_seconds": QUEUED_WORK_SECONDS}, idempotency_key=key,
                   priority=TARGET_PRIORITY)
        for key in keys
    ]))
    life.queued_keys = keys
    targets = set(keys[1::2])

    def waiting() -> list[tuple[int, str]]:
        started = Run.objects.filter(lease_token=OuterRef("lease_token"))
        return list(Job.objects.filter(idempotency_key__in=targets, status=JobStatus.RUNNING)
                    .exclude(Exists(started)).values_list("id", "idempotency_key"))

    def ended() -> bool:
        return not Job.objects.filter(idempotency_key__in=keys).exclude(
            status__in=[JobStatus.SUCCEEDED, JobStatus.DEAD, JobStatus.CANCELLED]).exists()

    deadline = time.monotonic() + 60
    while targets and not db.retrying(ended) and time.monotonic() < deadline:
        found = db.retrying(waiting)
        if found:
            db.retrying(lambda found=found: transitions.cancel_jobs(
                [job_id for job_id, _ in found], reason="harness"))
            life.queued_cancelled_keys += [key for _, key in found]
            targets -= {key for _, key in found}
        time.sleep(0.02)
    if not life.queued_cancelled_keys:
        ctx.record.notes.append("queued: no job was ever seen claimed and not started; no "
                                "cancel before a start")
    if not db.wait_until(ended, 60, interval=0.2):
        ctx.record.notes.append("queued: not every job ended within 60 s")


# --- a worker killed under a process-isolated handler -----------------------------------------

PROCESS_EFFECTS = "chaos.process_effects"


def worker_connections(worker_id: str, *, active: bool = False) -> int:
    """How many connections ``worker_id`` or a child process it started has open (``active``:
    running a statement now).

    A child inherits the worker's PGAPPNAME, so its connections carry the worker's id too.
    """

    def count() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND (application_name = %s OR application_name LIKE %s) "
                "AND (state = 'active' OR NOT %s)",
                [worker_id, f"% {worker_id}", active],
            )
            return int(cursor.fetchone()[0])

    return db.retrying(count)


def kill_under_process_handlers(ctx: Context, rounds: int) -> None:
    """Kill a worker while its child process writes effects one after another, ``rounds``
    times: once the worker is dead, no effect of that attempt may follow."""
    for round_no in range(rounds):
        key = f"orphan:{round_no}"
        job = db.enqueue(PROCESS_EFFECTS, key, {"key": key}, priority=TARGET_PRIORITY)
        check = OrphanCheck(key, job.pk)
        ctx.record.orphans.append(check)
        run = db.wait_until(lambda job=job: Run.objects.filter(
            job_id=job.pk, attempt=1, stage=Run.Stage.HOLDING).first(), 60)
        member = next((m for m in ctx.pool.running()
                       if run is not None and m.worker_id == run.worker_id), None)
        if run is None or member is None:
            ctx.record.notes.append(f"{key}: the handler never held on a live worker; "
                                    "no kill")
            continue
        check.worker_id = member.worker_id
        ctx.record.faults.append(Fault("kill", "orphan", db.db_now(), member.worker_id,
                                       running_jobs(member.worker_id)))
        ctx.pool.kill(member)
        db.wait_until(lambda member=member: not member.alive(), 30)
        # A statement sent before the death may still be running: once none is, every later
        # effect row was written by a statement that began after the worker was dead.
        db.wait_until(lambda member=member: worker_connections(
            member.worker_id, active=True) == 0, 30, interval=0.01)
        check.last_effect_id = db.retrying(
            lambda: Effect.objects.order_by("-id").values_list("id", flat=True).first()) or 0
        gone = db.wait_until(lambda member=member: worker_connections(member.worker_id) == 0,
                             30, interval=0.1)
        check.connections_outlived_worker = not gone
        if not db.wait_until(lambda job=job: job_status(job.pk) == JobStatus.SUCCEEDED, 60):
            ctx.record.notes.append(f"{key}: not succeeded within 60 s of the kill")


# --- random faults ----------------------------------------------------------------------------

_KINDS = ["kill", "stop", "disconnect", "restart"]
_WEIGHTS = [4, 2, 2, 1]


def random_faults(ctx: Context, seconds: float, every: tuple[float, float], restarts: int) -> None:
    """Strike random workers at random times for ``seconds``; the seed fixes the schedule.

    Which worker a draw hits depends on which are alive at that moment; the times, kinds and
    durations are the seed's. At most one worker is stopped at a time, and each stop lasts
    between one and two and a half leases.
    """
    rng = ctx.rng
    ends = time.monotonic() + seconds
    stopped: tuple[Member, float] | None = None
    while True:
        wait, kind = rng.uniform(*every), rng.choices(_KINDS, _WEIGHTS)[0]
        pick, stop_for = rng.random(), rng.uniform(1.0, 2.5) * ctx.lease_seconds
        fire_at = time.monotonic() + wait
        while time.monotonic() < min(fire_at, ends):
            if stopped is not None and time.monotonic() >= stopped[1]:
                ctx.pool.resume(stopped[0])
                stopped = None
            time.sleep(0.05)
        if time.monotonic() >= ends:
            break
        if kind == "restart":
            if restarts > 0:
                restarts -= 1
                restart_database(ctx, "random")
                continue
            kind = "kill"
        if kind == "stop" and stopped is not None:
            kind = "kill"
        members = ctx.pool.running()
        if len(members) < 2:
            continue
        member = members[int(pick * len(members))]
        record = Fault(kind, "random", db.db_now(), member.worker_id,
                       running_jobs(member.worker_id))
        ctx.record.faults.append(record)
        if kind == "kill":
            ctx.pool.kill(member)
        elif kind == "stop":
            ctx.pool.stop(member)
            stopped = (member, time.monotonic() + stop_for)
            record.detail = f"stopped for {stop_for:.1f}s"
        else:
            record.detail = f"{db.terminate_backends(member.worker_id)} connections terminated"
    if stopped is not None:
        ctx.pool.resume(stopped[0])
