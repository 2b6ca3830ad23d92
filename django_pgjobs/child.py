"""The child process of process-isolated handlers (see ``worker.isolation``).

A spawned child imports this module before Django is set up, so it imports nothing that loads
models at import time: ``run_jobs`` sets Django up first and only then imports what runs a job.

A child never outlives its worker. Its handler's timeout and cancel are enforced by the worker,
and once the worker is gone the job's lease runs out and another worker runs the job again: a
child left running would overlap that attempt. On Linux the kernel kills the child when the
worker thread that started it ends (``PR_SET_PDEATHSIG``); elsewhere a thread of the child
watches its parent. And the child looks for its parent again before it starts each handler.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from multiprocessing.connection import Connection

# <linux/prctl.h>: deliver a signal to this process when its parent thread ends.
PR_SET_PDEATHSIG = 1
# How often a child without PR_SET_PDEATHSIG looks whether its parent is still there.
PARENT_CHECK_SECONDS = 0.1
# The exit status of a child that found its worker gone.
EXIT_ORPHANED = 70


# What the child sends when it is set up and waits for a job, and when a job's handler starts:
# the parent sends a job only to a ready child, and counts the job's timeout from its start.
READY = "ready"
STARTED = "started"


def run_jobs(conn: Connection, parent_pid: int, using: str, database: str) -> None:
    """Set Django up, then run each job the parent sends and send back its outcome.

    ``database`` is the name of the database the parent uses for ``using``. In a deployed
    worker it is the name the settings give; under a test runner (Django's, pytest-django's),
    which points the parent's connection at the test database by changing only its NAME after
    start-up, it is that test database's, which the child's freshly read settings do not name.
    ``testing.drain`` runs process-isolated handlers in children too, so every project's test
    run that reaches one needs this, not only this package's own tests.
    """
    die_with_parent(parent_pid)
    import django

    django.setup()
    from django.db import connections

    connections[using].settings_dict["NAME"] = database
    # After setup: these modules need Django's models loaded.
    from .context import JobContext
    from .executor import execute

    conn.send(READY)
    while True:
        message = conn.recv()
        if message is None:
            return
        job, worker_id, using = message
        if os.getppid() != parent_pid:  # the worker died while the job was on its way
            os._exit(EXIT_ORPHANED)
        conn.send(STARTED)
        conn.send(execute(job, JobContext(job, worker_id=worker_id, using=using)))


def die_with_parent(parent_pid: int) -> None:
    """Make this process end as soon as ``parent_pid``, its parent, is gone."""
    if not _kill_me_with_parent():
        threading.Thread(target=_watch_parent, args=(parent_pid,), name="pgjobs-parent-watch",
                         daemon=True).start()
    # The parent may have died before the kernel was asked: the signal will never come, and
    # this process was handed to another parent already.
    if os.getppid() != parent_pid:
        os._exit(EXIT_ORPHANED)


def _kill_me_with_parent() -> bool:
    """Ask the kernel for SIGKILL when the parent ends; False where that cannot be had."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        threading.Event().wait(PARENT_CHECK_SECONDS)
    os._exit(EXIT_ORPHANED)
