"""How fast the lifecycle controls act: a cancel reaching a running handler, a pause.

``python -m bench.lifecycle [--samples 10]``

One ``pgjobs_worker`` process (4 executor threads, listening for notifications) serves every
measurement; a second run of the pause measurement uses a poll-only worker (``--no-listen``).

- **Cancel**: for each kind of handler (a thread that checks ``ctx.cancelled``, a thread that
  only heartbeats, a blocking handler in a child process, an async handler), a job is enqueued,
  left running for 0.2 s, and cancelled. The latency is the job's ``finished_at`` minus its
  ``cancel_requested_at``, both by the database clock.
- **Pause**: the worker drains a stream of no-op jobs from one queue; the queue is paused
  mid-drain. Reported: claims of the queue that started after the pause committed (the claim
  reads the pause in its own statement, so there should be none), and how long after the resume
  the first claim came.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from typing import Any

from bench import harness

DATABASE = "bench_lifecycle"
KINDS = {
    "thread checking ctx.cancelled": "bench.cancel.poll",
    "thread that only heartbeats": "bench.cancel.heartbeat",
    "blocking handler, isolation=process": "bench.cancel.process",
    "async handler": "bench.cancel.async",
}
QUEUE = "bench-pause"


def _wait(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.005)


def _worker(*flags: str) -> subprocess.Popen[bytes]:
    log = harness.ROOT / "bench" / "results" / "logs" / "lifecycle.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return subprocess.Popen(
            [harness.PYTHON, harness.MANAGE, "pgjobs_worker", "--concurrency", "4",
             "--log-level", "WARNING", *flags],
            env=harness.child_env(DATABASE), cwd=harness.ROOT, stdout=out, stderr=out)


def cancels(samples: int) -> dict[str, list[float]]:
    from django_pgjobs import enqueue, transitions
    from django_pgjobs.models import Job

    latencies: dict[str, list[float]] = {kind: [] for kind in KINDS}
    worker = _worker()
    try:
        for _ in range(samples):
            for kind, task in KINDS.items():
                job = enqueue(task, {})
                _wait(lambda job=job: Job.objects.filter(pk=job.pk, status="running").exists(),
                      60, f"{task} to start")
                time.sleep(0.2)
                transitions.cancel_jobs([job.pk], reason="bench")
                _wait(lambda job=job: Job.objects.filter(pk=job.pk, status="cancelled").exists(),
                      60, f"{task} to end cancelled")
                asked, ended = Job.objects.values_list(
                    "cancel_requested_at", "finished_at").get(pk=job.pk)
                latencies[kind].append((ended - asked).total_seconds())
    finally:
        harness.stop_process(worker)
    return latencies


def pause(listen: bool, jobs: int = 20_000) -> dict[str, Any]:
    from django.db import connection, transaction

    from django_pgjobs import JobSpec, enqueue_many, transitions
    from django_pgjobs.models import Job

    Job.objects.filter(queue=QUEUE).delete()
    with transaction.atomic():
        enqueue_many([JobSpec.of("bench.noop", {"n": i}, queue=QUEUE) for i in range(jobs)])
    worker = _worker(*([] if listen else ["--no-listen"]))
    try:
        _wait(lambda: Job.objects.filter(queue=QUEUE, status="succeeded").count() >= jobs // 10,
              120, "the drain to get going")
        transitions.pause_queue(QUEUE, reason="bench")
        with connection.cursor() as cursor:
            cursor.execute("SELECT now()")
            paused_at = cursor.fetchone()[0]
        time.sleep(2.0)
        # A job's claimed_at is its latest claim (its attempt's row is written when it ends).
        after_pause = Job.objects.filter(queue=QUEUE, claimed_at__gt=paused_at).count()
        left = Job.objects.filter(queue=QUEUE, status="ready").count()
        transitions.resume_queue(QUEUE, reason="bench")
        with connection.cursor() as cursor:
            cursor.execute("SELECT now()")
            resumed_at = cursor.fetchone()[0]
        _wait(lambda: Job.objects.filter(queue=QUEUE, claimed_at__gt=resumed_at).exists(),
              60, "a claim after the resume")
        first = Job.objects.filter(queue=QUEUE, claimed_at__gt=resumed_at).earliest(
            "claimed_at").claimed_at
    finally:
        harness.stop_process(worker)
    return {"claims_after_pause": after_pause, "ready_while_paused": left,
            "resume_to_first_claim_s": (first - resumed_at).total_seconds()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=10)
    args = parser.parse_args()
    harness.fresh_django(DATABASE)

    latencies = cancels(args.samples)
    print(f"\n{'cancel of a running handler':40} {'p50 s':>7} {'max s':>7} {'samples':>8}")
    for kind, values in latencies.items():
        print(f"{kind:40} {statistics.median(values):7.3f} {max(values):7.3f} {len(values):8}")
    print(f"\n{'pause mid-drain (4 executors)':40} {'claims after':>13} {'ready held':>11} "
          f"{'resume to claim s':>18}")
    for listen in (True, False):
        result = pause(listen)
        label = "listening worker" if listen else "poll-only worker (--no-listen)"
        print(f"{label:40} {result['claims_after_pause']:13} {result['ready_while_paused']:11} "
              f"{result['resume_to_first_claim_s']:18.3f}")


if __name__ == "__main__":
    main()
