"""manage.py run_demo: workers drain a real mixed workload while one of them is killed."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from django.contrib.auth.models import Permission, User
from django.core.management.base import BaseCommand, CommandParser
from django.db import connection, transaction
from django.db.models import Count

import django_pgjobs
from django_pgjobs.enqueuing import JobSpec
from django_pgjobs.models import KEPT_SUCCESS, Attempt, Dependency, IdempotencyReceipt, Job
from django_pgjobs.status import TERMINAL_STATUSES, AttemptOutcome, JobStatus
from django_pgjobs.workflows import chain, chord
from testproject.demo.models import LedgerEntry, Order

MANAGE = Path(__file__).resolve().parents[3] / "manage.py"
# Who can look at the demo's data in the admin afterwards (``make admin``): a superuser, and a
# staff user with only the view permissions, who sees every payload redacted and no action.
DEMO_USERS = {"demo": "demo", "viewer": "viewer"}
ADMIN_URL = "http://127.0.0.1:8000/admin/pgjobs/job/"
DASHBOARD_URL = "http://127.0.0.1:8000/admin/pgjobs/job/dashboard/"
# Export jobs of three customers, at most one of a customer's at once (demo.export's Limit).
EXPORTS = 60
# Card payments whose card numbers (and authorizations) the job table holds encrypted.
PAYMENTS = 20
# Workflows (docs/workflows.md): chords of render jobs, each with a publishing callback, and
# chains of steps, each step after the one before.
CHORDS, CHORD_WIDTH, CHAINS, CHAIN_LENGTH = 5, 10, 10, 4


class Command(BaseCommand):
    help = "Enqueue a mixed workload, drain it with worker processes, kill one, print a summary."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--jobs", type=int, default=3000)
        parser.add_argument("--workers", type=int, default=3)
        parser.add_argument("--concurrency", type=int, default=2)
        parser.add_argument("--timeout", type=float, default=50.0)
        parser.add_argument("--seed", type=int, default=7)

    def handle(self, *args: Any, **options: Any) -> None:
        random.seed(options["seed"])
        self._reset()
        started = time.monotonic()
        enqueued = self._enqueue(options["jobs"])
        self.stdout.write(f"enqueued {enqueued} jobs in {time.monotonic() - started:.2f}s")
        drain_started = time.monotonic()
        kills = self._drain(options["workers"], options["concurrency"], options["timeout"])
        elapsed = time.monotonic() - drain_started
        self._summary(enqueued, elapsed, kills)
        self._admin_users()
        self.stdout.write("")
        self.stdout.write(f"See it in the admin: run `make admin`, then open {ADMIN_URL}")
        self.stdout.write(f"  and the dashboard (workers, queues, history, errors): "
                          f"{DASHBOARD_URL}")
        self.stdout.write("  as demo/demo (superuser: every action) or viewer/viewer (view only: "
                          "payloads redacted, no actions)")

    def _admin_users(self) -> None:
        superuser, viewer = (
            User.objects.update_or_create(username=name, defaults={"is_staff": True})[0]
            for name in DEMO_USERS
        )
        superuser.is_superuser = True
        for user in (superuser, viewer):
            user.set_password(DEMO_USERS[user.username])
            user.save()
        viewer.user_permissions.set(Permission.objects.filter(
            content_type__app_label="pgjobs", codename__startswith="view_",
        ).exclude(codename="view_raw_payload"))

    def _reset(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "TRUNCATE pgjobs_attempt, pgjobs_job, pgjobs_receipt, pgjobs_key_slot, "
                "pgjobs_key_limit, pgjobs_dependency, demo_ledgerentry, demo_order "
                "RESTART IDENTITY"
            )

    def _enqueue(self, total: int) -> int:
        charges = max(1, total // 20)
        # Orders and their charge jobs commit together: no order without its job, no job
        # without its order, and no on_commit hook.
        with transaction.atomic():
            orders = Order.objects.bulk_create(
                Order(reference=f"ORD-{i:05d}", amount_cents=random.randint(100, 99_999))
                for i in range(charges)
            )
            # The card travels in the payload to show redaction: the admin hides it.
            specs = [JobSpec.of("demo.charge", {"order_id": o.pk, "sleep": 0.002,
                                                "card": {"number": "4242424242424242"}},
                                idempotency_key=f"charge:{o.reference}") for o in orders]
            django_pgjobs.enqueue_many(specs)
        # A client retrying its request replays the same enqueue: no second job.
        replays = [JobSpec.of("demo.charge", {"order_id": o.pk},
                              idempotency_key=f"charge:{o.reference}") for o in orders[:20]]
        django_pgjobs.enqueue_many(replays)

        mix: list[JobSpec] = []
        rest = total - charges
        for i in range(rest):
            roll = random.random()
            if roll < 0.55:
                mix.append(JobSpec.of("demo.noop", {"n": i}, priority=random.choice([0, 0, 5])))
            elif roll < 0.80:
                mix.append(JobSpec.of("demo.work", {"n": i, "sleep": 0.004}))
            elif roll < 0.92:
                mix.append(JobSpec.of("demo.flaky", {"failures": random.choice([1, 2, 9])}))
            elif roll < 0.97:
                mix.append(JobSpec.of("demo.invalid", {"order": i}))
            else:
                mix.append(JobSpec.of("demo.noop", {"n": i}, queue="reports", priority=-10))
        mix += [JobSpec.of("demo.long", {"seconds": 2.5}) for _ in range(4)]
        # Exports under a limit of one at a time per customer (docs/limits.md): all but the
        # first of each customer wait throttled, and each end of a run hands its slot on.
        mix += [JobSpec.of("demo.export", {"customer": f"customer-{i % 3}", "seconds": 0.02})
                for i in range(EXPORTS)]
        mix += [JobSpec.of("demo.card_payment", {"order": i, "card": {"number": _card(i)}})
                for i in range(PAYMENTS)]
        django_pgjobs.enqueue_many(mix)
        # Each workflow in one call: its jobs and edges commit together.
        for c in range(CHORDS):
            django_pgjobs.enqueue_many(chord(
                [JobSpec.of("demo.work", {"n": f"render-{c}-{m}", "sleep": 0.01})
                 for m in range(CHORD_WIDTH)],
                JobSpec.of("demo.noop", {"publish": c})))
        for c in range(CHAINS):
            django_pgjobs.enqueue_many(chain(*(JobSpec.of("demo.noop", {"chain": c, "step": s})
                                               for s in range(CHAIN_LENGTH))))
        return Job.objects.count()

    def _drain(self, workers: int, concurrency: int, timeout: float) -> int:
        env = dict(os.environ, PGJOBS_LOG_LEVEL="ERROR")
        deadline = time.monotonic() + timeout
        kills = 0
        round_ = 0
        while time.monotonic() < deadline and self._unfinished():
            procs = [self._start(f"demo-{round_}-{n}", concurrency, env) for n in range(workers)]
            if round_ == 0:
                # Kill one worker mid-run, while it holds jobs: they wait out their lease, then
                # the rescue step hands them to the others.
                held = Job.objects.filter(status=JobStatus.RUNNING, lease_owner="demo-0-0")
                while (Job.objects.filter(status=JobStatus.SUCCEEDED).count() < 300
                       or not held.exists()) and procs[0].poll() is None:
                    time.sleep(0.01)
                procs[0].send_signal(signal.SIGKILL)
                kills += 1
                # A settlement already sent when the process died still commits: count after.
                time.sleep(0.5)
                self.stdout.write(f"killed worker demo-0-0 (SIGKILL); it left {held.count()} "
                                  "jobs running under its lease")
            for proc in procs:
                proc.wait(max(1.0, deadline - time.monotonic()))
            round_ += 1
            if self._unfinished():
                time.sleep(0.3)  # let backoffs and expired leases come due
        return kills

    def _start(self, worker_id: str, concurrency: int, env: dict[str, str]) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, str(MANAGE), "pgjobs_worker", "--burst", "--worker-id", worker_id,
             "--concurrency", str(concurrency), "--batch-size", "10", "--poll-interval", "0.1",
             "--log-level", "ERROR"],
            env=env, stdout=subprocess.DEVNULL,
        )

    def _unfinished(self) -> int:
        return Job.objects.exclude(status__in=TERMINAL_STATUSES).count()

    def _summary(self, enqueued: int, elapsed: float, kills: int) -> None:
        out = self.stdout.write
        by_status = dict(Job.objects.values_list("status").annotate(n=Count("id")))
        finished = sum(by_status.get(s, 0) for s in TERMINAL_STATUSES)
        out("")
        out(f"drained {finished}/{enqueued} jobs in {elapsed:.1f}s "
            f"({finished / elapsed:.0f} jobs/s) with {kills} worker killed mid-run")
        out("jobs by status:")
        for status in JobStatus:
            out(f"  {status.value:<10} {by_status.get(status.value, 0):>6}")
        attempts = dict(Attempt.objects.values_list("outcome").annotate(n=Count("id")))
        # A success has no attempt row: its job keeps it (Job.success_attempt).
        attempts[AttemptOutcome.SUCCEEDED.value] = attempts.get(
            AttemptOutcome.SUCCEEDED.value, 0) + Job.objects.filter(KEPT_SUCCESS).count()
        out("attempts by outcome:")
        for outcome in AttemptOutcome:
            if attempts.get(outcome.value):
                out(f"  {outcome.value:<14} {attempts[outcome.value]:>6}")
        retried = Job.objects.filter(attempts__gt=1).count()
        out(f"jobs that needed more than one attempt: {retried}")
        out("dead jobs by reason:")
        for reason, n in (Job.objects.filter(status=JobStatus.DEAD)
                          .values_list("terminal_reason").annotate(n=Count("id"))):
            out(f"  {reason:<20} {n:>6}")
        charges = LedgerEntry.objects.filter(kind="charge")
        duplicate_charges = charges.count() - charges.values("key").distinct().count()
        work = LedgerEntry.objects.filter(kind="work")
        duplicate_work = work.count() - work.values("key").distinct().count()
        out(f"charges: {Order.objects.filter(charged=True).count()} orders charged, "
            f"{IdempotencyReceipt.objects.count()} receipts, {duplicate_charges} duplicate "
            "charges (receipted)")
        out(f"unreceipted side effects repeated by at-least-once delivery: {duplicate_work}")
        exports = [*Attempt.objects.filter(job__task="demo.export")
                   .values_list("job__limit_key", "claimed_at", "finished_at"),
                   *Job.objects.filter(KEPT_SUCCESS, task="demo.export")
                   .values_list("limit_key", "claimed_at", "finished_at")]
        windows: dict[str, list[tuple[Any, Any]]] = {}
        for key, claimed_at, finished_at in exports:
            windows.setdefault(key, []).append((claimed_at, finished_at))
        most = max((at_once(spans) for spans in windows.values()), default=0)
        done = Job.objects.filter(task="demo.export", status=JobStatus.SUCCEEDED).count()
        out(f"exports: {done} of {EXPORTS} done for {len(windows)} customers under a limit of 1 "
            f"per customer; most of one customer's running at once: {most}")
        out(self._workflows())
        out(self._payments())
        if self._unfinished():
            out(f"NOT FINISHED: {self._unfinished()} jobs still waiting")

    def _payments(self) -> str:
        """The card payments, and whether any card number is in the table in plaintext."""
        done = Job.objects.filter(task="demo.card_payment", status=JobStatus.SUCCEEDED).count()
        with connection.cursor() as cursor:
            cursor.execute("SELECT string_agg(concat_ws(' ', payload::text, result::text), ' ') "
                           "FROM pgjobs_job WHERE task = 'demo.card_payment'")
            stored = cursor.fetchone()[0] or ""
        plaintext = sum(_card(i) in stored or f"auth-{_card(i)[-4:]}-{i}" in stored
                        for i in range(PAYMENTS))
        return (f"card payments: {done} of {PAYMENTS} done; card numbers and authorizations "
                f"found in plaintext in the job table: {plaintext}")

    def _workflows(self) -> str:
        """How the workflows went: every job that waited started only after its dependencies
        had ended (first claim against their finish, both by the database clock)."""
        early = 0
        waited = 0
        for job_id, upstream_finished, last in Dependency.objects.values_list(
                "job_id", "upstream__finished_at", "job__claimed_at"):
            # With no attempt row, the job's one attempt is its last (a success keeps none).
            first = (Attempt.objects.filter(job_id=job_id).order_by("claimed_at")
                     .values_list("claimed_at", flat=True).first()) or last
            if first is None:
                continue
            waited += 1
            early += upstream_finished is None or first < upstream_finished
        callbacks = Job.objects.filter(task="demo.noop", payload__has_key="publish",
                                       status=JobStatus.SUCCEEDED).count()
        return (f"workflows: {CHORDS} chords of {CHORD_WIDTH} (callbacks run: {callbacks}) and "
                f"{CHAINS} chains of {CHAIN_LENGTH}; {waited} edges waited on, {early} of them "
                "started before their dependency ended")


def _card(i: int) -> str:
    return f"4000{i:012d}"


def at_once(spans: list[tuple[Any, Any]]) -> int:
    """The most of ``spans`` (start, end) open at one instant (an end before a start)."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most
