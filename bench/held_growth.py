"""Where the job table grows while a snapshot is held: bytes per job, relation by relation.

``python -m bench.held_growth [--jobs 20000] [--workers 2]``: on a fresh database, one
``REPEATABLE READ`` transaction with a transaction id is held open (as an analytics query or an
idle-in-transaction session would), then ``--jobs`` no-op jobs are enqueued in transactions of
500 and drained by worker processes in burst mode. Vacuum and page pruning can remove nothing
the held snapshot might still see, so every row version and index entry each step writes stays;
the table says how many bytes per job each relation of the job table (and the attempt table)
grew by in the enqueue and in the drain. The soak (``bench.soak --hold-snapshot``) shows the same
growth over time under a steady load; this one says which writes it is made of.
"""

from __future__ import annotations

import argparse
import subprocess

import psycopg

from bench import harness
from bench.report import _table

DATABASE = "bench_held"
CHUNK = 500
SIZES = """
SELECT c.relname, pg_relation_size(c.oid)
FROM pg_class AS c
WHERE c.oid IN ('pgjobs_job'::regclass, 'pgjobs_attempt'::regclass)
   OR c.oid IN (SELECT indexrelid FROM pg_index
                WHERE indrelid IN ('pgjobs_job'::regclass, 'pgjobs_attempt'::regclass))
   OR c.oid = (SELECT reltoastrelid FROM pg_class WHERE oid = 'pgjobs_job'::regclass)
"""


def sizes() -> dict[str, int]:
    return {name: size for name, size in harness.execute(DATABASE, SIZES)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    harness.fresh_django(DATABASE)
    from django.db import transaction

    from django_pgjobs import JobSpec, enqueue_many

    with psycopg.connect(harness.dsn(DATABASE)) as holder:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT txid_current()")
        start = sizes()
        for first in range(0, args.jobs, CHUNK):
            with transaction.atomic():
                enqueue_many([JobSpec.of("bench.noop", {"n": i})
                              for i in range(first, min(first + CHUNK, args.jobs))])
        enqueued = sizes()
        command = [harness.PYTHON, harness.MANAGE, "pgjobs_worker", "--burst",
                   "--concurrency", "1", "--batch-size", "10", "--log-level", "WARNING"]
        workers = [subprocess.Popen(command, env=harness.child_env(DATABASE), cwd=harness.ROOT)
                   for _ in range(args.workers)]
        try:
            codes = [worker.wait(timeout=600) for worker in workers]
        finally:
            for worker in workers:
                if worker.poll() is None:  # the wait timed out: none is left running
                    worker.kill()
                    worker.wait()
        if any(codes):
            raise SystemExit(f"a worker exited with {codes}")
        drained = sizes()
        [(left,)] = harness.execute(DATABASE, "SELECT count(*) FROM pgjobs_job "
                                              "WHERE status <> 'succeeded'")
        holder.rollback()
    if left:
        raise SystemExit(f"{left} jobs did not succeed")
    jobs = args.jobs
    rows = []
    for name in sorted(drained, key=lambda n: (-(drained[n] - start[n]), n)):
        grew_enqueue, grew_drain = enqueued[name] - start[name], drained[name] - enqueued[name]
        if grew_enqueue or grew_drain:
            rows.append([name, f"{grew_enqueue / jobs:.0f}", f"{grew_drain / jobs:.0f}",
                         f"{(grew_enqueue + grew_drain) / jobs:.0f}"])
    total_enqueue = sum(enqueued[n] - start[n] for n in drained)
    total_drain = sum(drained[n] - enqueued[n] for n in drained)
    rows.append(["all", f"{total_enqueue / jobs:.0f}", f"{total_drain / jobs:.0f}",
                 f"{(total_enqueue + total_drain) / jobs:.0f}"])
    print(f"{jobs} jobs, {args.workers} workers, a snapshot held throughout; bytes per job:")
    print(_table(["relation", "enqueue", "drain", "both"], rows))


if __name__ == "__main__":
    main()
