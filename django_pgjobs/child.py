"""The child process of process-isolated handlers (see ``worker.isolation``).

A spawned child imports this module before Django is set up, so it imports nothing that loads
models at import time: ``run_jobs`` sets Django up first and only then imports what runs a job.
"""

from __future__ import annotations

from multiprocessing.connection import Connection


def run_jobs(conn: Connection) -> None:
    """Set Django up, then run each job the parent sends and send back its outcome."""
    import django

    django.setup()
    # After setup: these modules need Django's models loaded.
    from .context import JobContext
    from .executor import execute

    while True:
        message = conn.recv()
        if message is None:
            return
        job, worker_id, using = message
        conn.send(execute(job, JobContext(job, worker_id=worker_id, using=using)))
