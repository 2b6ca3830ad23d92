"""What every measurement needs: bench databases, child processes, and a drain timer.

Only databases whose name starts with ``bench_`` are ever created or dropped here.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
MANAGE = str(ROOT / "bench" / "manage.py")
SERVER_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")

_POLL_SECONDS = 0.05


def dsn(database: str) -> str:
    """The server's URL with ``database`` as its database."""
    return urlunsplit(urlsplit(SERVER_URL)._replace(path=f"/{database}"))


def recreate_database(name: str) -> None:
    """Drop and create the bench database ``name`` (refuses any other name)."""
    if not name.startswith("bench_"):
        raise ValueError(f"refusing to touch database {name!r}: bench databases start with bench_")
    with psycopg.connect(dsn("postgres"), autocommit=True) as conn:
        name_sql = sql.Identifier(name)
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name_sql))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(name_sql))


def execute(database: str, statement: str, params: Sequence[Any] | None = None) -> list[tuple]:
    """Run one statement in autocommit (VACUUM needs it) and return its rows, if any."""
    with psycopg.connect(dsn(database), autocommit=True) as conn:
        cursor = conn.execute(statement.encode(), params)  # type: ignore[call-overload]
        return cursor.fetchall() if cursor.description else []


def child_env(database: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    env["BENCH_DB_NAME"] = database
    env["BENCH_DATABASE_URL"] = dsn(database)
    env["BENCH_PROCRASTINATE_DSN"] = dsn(database)
    env.update(extra)
    return env


def measure(
    system: str,
    action: str,
    database: str,
    timeout: float = 900,
    env: dict[str, str] | None = None,
    python: str = PYTHON,
    **kwargs: Any,
) -> Any:
    """Run ``bench.measure <system> <action>`` in a child process and return its JSON answer.

    ``python`` runs it: this interpreter unless the system's client needs another one.
    """
    completed = subprocess.run(
        [python, "-m", "bench.measure", system, action, json.dumps(kwargs)],
        env=child_env(database, **(env or {})), cwd=ROOT, capture_output=True, text=True,
        timeout=timeout,
    )
    if completed.returncode != 0:
        raise RuntimeError(f"{system} {action} failed:\n{completed.stderr[-3000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def fresh_django(database: str) -> None:
    """``database`` made anew and migrated, and Django set up in this process against it."""
    recreate_database(database)
    manage(database, "migrate", "--verbosity", "0")
    os.environ.update(child_env(database))
    import django

    django.setup()


def manage(database: str, *args: str) -> None:
    subprocess.run([PYTHON, MANAGE, *args], env=child_env(database), cwd=ROOT, check=True)


@dataclass
class Finished:
    returncode: int
    cpu_seconds: float
    max_rss_mb: float


@dataclass
class Workers:
    """Worker processes started together; reaped with wait4 for their exact CPU and peak RSS."""

    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    finished: dict[int, Finished] = field(default_factory=dict)

    @classmethod
    def start(cls, commands: Sequence[Sequence[str]], env: dict[str, str], log: Path) -> Workers:
        log.parent.mkdir(parents=True, exist_ok=True)
        workers = cls()
        with log.open("ab") as out:
            for command in commands:
                workers.procs.append(
                    subprocess.Popen(command, env=env, cwd=ROOT, stdout=out, stderr=out)
                )
        return workers

    def reap(self) -> bool:
        """Collect exited processes; return True when all have exited."""
        for proc in self.procs:
            if proc.pid in self.finished:
                continue
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid == 0:
                continue
            proc.returncode = os.waitstatus_to_exitcode(status)
            self.finished[proc.pid] = Finished(
                proc.returncode, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024
            )
        return len(self.finished) == len(self.procs)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the ones still running, then SIGKILL after ``grace`` seconds."""
        # os.kill, not Popen.send_signal: that one reaps the process first (poll), and
        # wait4 would then find nothing to report.
        self.reap()
        for proc in self.procs:
            if proc.pid not in self.finished:
                os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while not self.reap() and time.monotonic() < deadline:
            time.sleep(0.05)
        for proc in self.procs:
            if proc.pid not in self.finished:
                os.kill(proc.pid, signal.SIGKILL)
        while not self.reap():
            time.sleep(0.05)


@dataclass
class Drain:
    jobs: int
    jobs_per_s: float
    seconds: float
    cpu_us_per_job: float | None
    max_rss_mb: float | None
    complete: bool
    load_average: float  # of the whole machine over the minute before the drain ended
    # The server's work per drained job, from its own counters (see ServerWork).
    wal_bytes_per_job: float
    full_page_images_per_job: float
    transactions_per_job: float
    tuples_written_per_job: float
    server_cpu_us_per_job: float | None  # the whole server's CPU, when it is on this machine
    commits_elsewhere: int  # in the server's other databases while this one drained
    # From spawning the workers until the table first showed nothing outstanding: start-up,
    # the ramp and the stragglers included (None when the drain did not complete).
    end_to_end_seconds: float | None = None
    end_to_end_jobs_per_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


# Counters PostgreSQL keeps itself: the WAL position and full-page images written (both the
# whole server's), transactions committed in this database and in the others (but "postgres",
# where no bench runs), and rows inserted, updated and deleted in this database's tables.
_SERVER_WORK_SQL = """
SELECT pg_current_wal_lsn(), (SELECT wal_fpi FROM pg_stat_wal),
       (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),
       (SELECT coalesce(sum(xact_commit), 0) FROM pg_stat_database
        WHERE datname NOT IN (current_database(), 'postgres')),
       (SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) FROM pg_stat_user_tables),
       pg_backend_pid()
"""


def server_cpu_seconds(backend_pid: int) -> float | None:
    """User and system CPU the whole PostgreSQL server has used: the postmaster, its live
    processes, and (as the postmaster's reaped children) every backend that has ended.

    ``backend_pid`` is one of the server's backends; None when it is not on this machine (or
    is not readable).
    """
    try:
        postmaster = int(_proc_stat(backend_pid)[1])
        own = _proc_stat(postmaster)
        children = 0
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    fields = _proc_stat(int(entry.name))
                except (FileNotFoundError, ProcessLookupError):
                    continue
                if int(fields[1]) == postmaster:
                    children += _cpu_ticks(fields)
    except (OSError, ValueError, IndexError):
        return None
    # Its own, and its reaped children's: cutime and cstime, the two fields after stime.
    ticks = _cpu_ticks(own) + int(own[13]) + int(own[14]) + children
    return ticks / os.sysconf("SC_CLK_TCK")


def stop_process(process: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """SIGTERM ``process`` and wait for it; SIGKILL it if it has not gone within ``timeout``."""
    process.terminate()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def process_cpu_seconds(pid: int) -> float | None:
    """User and system CPU a process of this machine has used so far; None when it is gone."""
    try:
        fields = _proc_stat(pid)
    except OSError:
        return None
    return _cpu_ticks(fields) / os.sysconf("SC_CLK_TCK")


def _proc_stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name: [0] is the state, [1] the parent."""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()


def _cpu_ticks(fields: Sequence[str]) -> int:
    """User and system clock ticks, from ``_proc_stat``'s fields (utime, then stime)."""
    return int(fields[11]) + int(fields[12])


@dataclass(frozen=True)
class ServerWork:
    """A reading of the server's counters; the difference of two is the work between them.

    The WAL figures are the whole server's, so other databases' writes in the same seconds
    count too; the commits made elsewhere meanwhile say whether there were any. Statistics
    reach the counters when a backend ends or goes idle, at most once a second, so a reading
    waits for them to settle.
    """

    wal_lsn: str
    full_page_images: int
    commits: int
    commits_elsewhere: int
    tuples_written: int
    cpu_seconds: float | None  # the whole server's, when it runs on this machine

    @classmethod
    def read(cls, database: str) -> ServerWork:
        with psycopg.connect(dsn(database), autocommit=True) as conn:
            row = conn.execute(_SERVER_WORK_SQL.encode()).fetchone()
            assert row is not None
            # While connected: the backend that answered leads to the postmaster.
            cpu = server_cpu_seconds(row[-1])
        return cls(str(row[0]), *(int(value) for value in row[1:-1]), cpu)

    @classmethod
    def settled(cls, database: str, timeout: float = 5.0) -> tuple[ServerWork, int]:
        """A reading once the commit and row counters stopped moving, and how many reads (one
        transaction each) it took."""
        reading, reads = cls.read(database), 1
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            time.sleep(1.1)
            again, reads = cls.read(database), reads + 1
            # Each reading is one transaction of its own; beyond it, nothing moved.
            if (again.tuples_written == reading.tuples_written
                    and again.commits <= reading.commits + 1):
                return again, reads
            reading = again
        return reading, reads

    def per_job(
        self, before: ServerWork, jobs: int, own_commits: int, own_cpu_seconds: float = 0.0
    ) -> dict[str, Any]:
        """The work from ``before`` to this reading per job, less ``own_commits`` and
        ``own_cpu_seconds`` (the harness's own reads)."""
        with psycopg.connect(dsn("postgres"), autocommit=True) as conn:
            row = conn.execute(b"SELECT pg_wal_lsn_diff(%s, %s)",
                               (self.wal_lsn, before.wal_lsn)).fetchone()
        assert row is not None
        jobs = max(jobs, 1)
        return {
            "wal_bytes_per_job": float(row[0]) / jobs,
            "full_page_images_per_job": (self.full_page_images - before.full_page_images) / jobs,
            "transactions_per_job": max(0, self.commits - before.commits - own_commits) / jobs,
            "tuples_written_per_job": (self.tuples_written - before.tuples_written) / jobs,
            "server_cpu_us_per_job": (
                max(0.0, self.cpu_seconds - before.cpu_seconds - own_cpu_seconds) / jobs * 1e6
                if self.cpu_seconds is not None and before.cpu_seconds is not None else None),
            # A database dropped and made again meanwhile can make this negative: none, then.
            "commits_elsewhere": max(0, self.commits_elsewhere - before.commits_elsewhere),
        }


def drain(
    database: str,
    remaining_sql: str,
    jobs: int,
    commands: Sequence[Sequence[str]],
    log: Path,
    *,
    timeout: float,
    python_workers: bool = True,
    startup_cpu_seconds: float = 0.0,
    env: dict[str, str] | None = None,
    exits_when_empty: bool = True,
) -> Drain:
    """Start ``commands`` against ``jobs`` preloaded jobs and time the steady state.

    The rate is taken between 5% and 95% done, so process start-up and the last stragglers are
    left out for every system alike; "done" is read from the system's own table. Beside it, the
    end-to-end time runs from spawning the workers until the table first shows nothing
    outstanding. The CPU a worker spends starting and stopping (``startup_cpu_seconds``, see
    ``startup_cpu``) is taken off its CPU per job. Around the drain the server's counters are
    read (``ServerWork``). Workers with no burst mode (``exits_when_empty`` false) are stopped
    as soon as nothing is outstanding, rather than waited for.
    """
    execute(database, "VACUUM ANALYZE")
    # After a checkpoint the first change to each page writes the whole page to the WAL; one
    # now makes every drain pay that alike instead of whenever the server's next one falls.
    execute(database, "CHECKPOINT")
    before, _ = ServerWork.settled(database)
    low, high = jobs * 0.05, jobs * 0.95
    t_low = t_high = t_done = None
    done_low = done_high = polls = 0
    start = time.monotonic()
    workers = Workers.start(commands, child_env(database, **(env or {})), log)
    with psycopg.connect(dsn(database), autocommit=True) as conn:
        # The timer's own count costs the server CPU too, more for a table that keeps its
        # history: its backend's CPU is read apart and left out of the server's.
        poller = conn.info.backend_pid
        poll_cpu = process_cpu_seconds(poller)
        while True:
            row = conn.execute(remaining_sql.encode()).fetchone()
            polls += 1
            assert row is not None
            done = jobs - row[0]
            now = time.monotonic()
            if t_low is None and done >= low:
                t_low, done_low = now, done
            if t_high is None and done >= high:
                t_high, done_high = now, done
            if t_done is None and done >= jobs:
                t_done = now
            all_exited = workers.reap()
            if (done >= jobs and (all_exited or not exits_when_empty)) or now - start > timeout:
                break
            if done >= jobs and now - (t_high or now) > 30:
                break  # a worker that does not exit on an empty queue: stop it below
            time.sleep(_POLL_SECONDS)
        poll_cpu_after = process_cpu_seconds(poller)
    poll_cpu_seconds = (poll_cpu_after - poll_cpu
                        if poll_cpu is not None and poll_cpu_after is not None else 0.0)
    workers.stop()
    elapsed = time.monotonic() - start
    if t_low is not None and t_high is not None and t_high > t_low:
        rate = (done_high - done_low) / (t_high - t_low)
    else:
        rate = done / elapsed if elapsed else 0.0
    finished = list(workers.finished.values())
    cpu = max(0.0, sum(f.cpu_seconds for f in finished) - startup_cpu_seconds * len(finished))
    # Between the two readings: the last read that gave ``before``, the timer's polls, and the
    # reads that let the counters settle after.
    after, after_reads = ServerWork.settled(database)
    work = after.per_job(before, done, own_commits=polls + after_reads,
                         own_cpu_seconds=poll_cpu_seconds)
    return Drain(
        jobs=jobs,
        jobs_per_s=rate,
        seconds=elapsed,
        cpu_us_per_job=cpu / max(done, 1) * 1e6 if python_workers else None,
        max_rss_mb=statistics.mean(f.max_rss_mb for f in finished) if python_workers else None,
        complete=done >= jobs,
        load_average=os.getloadavg()[0],
        **work,
        end_to_end_seconds=t_done - start if t_done is not None else None,
        end_to_end_jobs_per_s=jobs / (t_done - start) if t_done is not None else None,
    )


def startup_cpu(
    database: str, command: Sequence[str], log: Path, env: dict[str, str], timeout: float = 60,
    ready_sql: str = "",
) -> float:
    """CPU seconds one worker spends starting and stopping on an empty queue (burst mode).

    A worker with no burst mode is stopped once ``ready_sql`` counts a row for it (and it has
    had a moment to start polling); its shutdown is then counted as well.
    """
    workers = Workers.start([command], child_env(database, **env), log)
    deadline = time.monotonic() + timeout
    while not workers.reap() and time.monotonic() < deadline:
        if ready_sql and execute(database, ready_sql)[0][0] > 0:
            time.sleep(0.5)
            break
        time.sleep(0.05)
    workers.stop()
    return next(iter(workers.finished.values())).cpu_seconds


def first_job_done(
    database: str, remaining_sql: str, command: Sequence[str], log: Path, env: dict[str, str],
    timeout: float = 60,
) -> float:
    """Seconds from spawning one worker until ``remaining_sql`` counts nothing outstanding."""
    started = time.monotonic()
    workers = Workers.start([command], child_env(database, **env), log)
    try:
        while execute(database, remaining_sql)[0][0] > 0:
            if time.monotonic() - started > timeout:
                raise RuntimeError(f"{command[0]}: no job done within {timeout:g}s; see {log}")
            time.sleep(0.005)
        return time.monotonic() - started
    finally:
        workers.stop()


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by nearest rank."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]
