"""Real ``manage.py pgjobs_worker`` processes, restarted when they die, signalled on demand."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
MANAGE = ROOT / "testproject" / "manage.py"

# The timings every process of a run uses: the workers and the harness read the same values.
TIMINGS = {
    "PGJOBS_POLL_INTERVAL_SECONDS": "0.2",
    "PGJOBS_RESCUE_INTERVAL_SECONDS": "0.5",
    "PGJOBS_RETRY_BASE_SECONDS": "0.05",
    "PGJOBS_RETRY_MAX_SECONDS": "1.0",
}


@dataclass
class Member:
    """One worker process; a slot's replacement after a death gets a new generation."""

    slot: int
    generation: int
    worker_id: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    # Set by the harness before it kills the process, so its death is not counted as a crash.
    doomed: bool = False
    stopped: bool = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass(frozen=True)
class Exit:
    worker_id: str
    pid: int
    returncode: int
    caused_by_harness: bool
    # The end of the worker's log when it died of something else than a SIGKILL.
    log_tail: str = ""


@dataclass
class WorkerPool:
    """``size`` worker slots; a supervisor thread replaces any worker that exits."""

    size: int
    args: list[str]
    env: dict[str, str]
    log_dir: Path
    members: dict[int, Member] = field(default_factory=dict)
    exits: list[Exit] = field(default_factory=list)
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _closing: threading.Event = field(default_factory=threading.Event)
    _generations: dict[int, int] = field(default_factory=dict)
    _supervisor: threading.Thread | None = None

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with self._lock:
            for slot in range(self.size):
                self._spawn(slot)
        self._supervisor = threading.Thread(target=self._supervise, name="harness-supervisor",
                                            daemon=True)
        self._supervisor.start()

    def _spawn(self, slot: int) -> Member:
        generation = self._generations.get(slot, 0) + 1
        self._generations[slot] = generation
        worker_id = f"chaos-w{slot}-g{generation}"
        log_path = self.log_dir / f"{worker_id}.log"
        env = {**self.env, "PGAPPNAME": worker_id}  # names its connections in pg_stat_activity
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, str(MANAGE), "pgjobs_worker", "--worker-id", worker_id,
                 *self.args],
                env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
            )
        member = Member(slot, generation, worker_id, proc, log_path)
        self.members[slot] = member
        return member

    def _supervise(self) -> None:
        while not self._closing.wait(0.1):
            with self._lock:
                for slot, member in list(self.members.items()):
                    code = member.proc.poll()
                    if code is None or self._closing.is_set():
                        continue
                    self._exited(member, code)
                    self._spawn(slot)

    def _exited(self, member: Member, code: int) -> None:
        tail = ""
        if code != -9:
            lines = member.log_path.read_text(errors="replace").splitlines()
            tail = "\n".join(lines[-40:])
        self.exits.append(Exit(member.worker_id, member.pid, code, member.doomed, tail))

    def running(self) -> list[Member]:
        """Members alive and not stopped, in slot order."""
        with self._lock:
            return [m for _, m in sorted(self.members.items()) if m.alive() and not m.stopped]

    def by_pid(self, pid: int) -> Member | None:
        with self._lock:
            return next((m for m in self.members.values() if m.pid == pid), None)

    def kill(self, member: Member) -> None:
        """SIGKILL ``member``; the supervisor starts a replacement."""
        with self._lock:
            member.doomed = True
            os.kill(member.pid, signal.SIGKILL)

    def stop(self, member: Member) -> None:
        """SIGSTOP ``member``: it keeps its sockets and leases but does nothing."""
        with self._lock:
            member.stopped = True
            os.kill(member.pid, signal.SIGSTOP)

    def resume(self, member: Member) -> None:
        with self._lock:
            if member.alive():
                os.kill(member.pid, signal.SIGCONT)
            member.stopped = False

    def wait_started(self, timeout: float) -> None:
        """Wait until every worker has logged that it started."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                logs = [m.log_path for m in self.members.values()]
            if all("worker.start" in path.read_text(errors="replace") for path in logs
                   if path.exists()):
                return
            time.sleep(0.1)
        raise RuntimeError(f"workers did not start within {timeout}s; see {self.log_dir}")

    def shutdown(self, grace: float) -> dict[str, int | None]:
        """SIGTERM every worker (SIGCONT first if stopped); return each one's exit code."""
        self._closing.set()
        if self._supervisor is not None:
            self._supervisor.join(5)
        # A replacement still importing Django has no SIGTERM handler yet and would die of the
        # signal instead of draining: let it finish starting first.
        self.wait_started(60)
        with self._lock:
            members = []
            for member in self.members.values():
                code = member.proc.poll()
                if code is None:
                    members.append(member)
                else:
                    # It died after the supervisor's last look (a kill of the last tenth of a
                    # second): an exit like the others, not a worker that failed to drain.
                    self._exited(member, code)
        for member in members:
            if member.alive():
                if member.stopped:
                    self.resume(member)
                member.proc.send_signal(signal.SIGTERM)
        codes: dict[str, int | None] = {}
        deadline = time.monotonic() + grace
        for member in members:
            try:
                codes[member.worker_id] = member.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                codes[member.worker_id] = None  # did not drain in time: a wedged worker
                member.proc.kill()
                member.proc.wait(10)
        return codes
