"""The embedded PostgreSQL server of the test project (DATABASE_URL unset) stops when its last live
user exits, however the others ended; each test starts a real one in a temporary data directory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import psutil
import pytest

from tests.conftest import ROOT, wait_for
from tests.test_demo import free_port

pytestmark = pytest.mark.slow

# A user of the server that says when it joined, then waits to be killed.
CLIENT = textwrap.dedent("""
    import os, time
    from pathlib import Path
    from testproject.embedded import embedded_database
    embedded_database(Path(os.environ["PGJOBS_EMBEDDED_PGDATA"]))
    print("joined", flush=True)
    time.sleep(600)
""")

# Joins the server, starts a second user and SIGKILLs it, prints the postmaster's pid; then exits,
# or SIGKILLs itself when asked to.
COMMAND = textwrap.dedent("""
    import os, signal, subprocess, sys
    from pathlib import Path
    from testproject.embedded import embedded_database
    pgdata = Path(os.environ["PGJOBS_EMBEDDED_PGDATA"])
    embedded_database(pgdata)
    client = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE)
    assert client.stdout.readline() == b"joined\\n"
    client.send_signal(signal.SIGKILL)
    client.wait()
    print((pgdata / "postmaster.pid").read_text().split()[0], flush=True)
    if sys.argv[2] == "kill-itself":
        os.kill(os.getpid(), signal.SIGKILL)
""")


def environment(pgdata: Path) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items()
           if name not in ("DATABASE_URL", "PGJOBS_DATABASE_NAME")}
    env["PGJOBS_EMBEDDED_PGDATA"] = str(pgdata)
    return env


def gone(pid: int) -> bool:
    """The process exited (pg_ctl stop returns as the postmaster removes its pid file)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def users(pgdata: Path) -> list[list[float]]:
    return json.loads((pgdata / ".users.json").read_text())


@pytest.mark.parametrize(("through", "ending", "status"), [
    ([], "exit", 0),
    ([sys.executable, "-m", "testproject.embedded"], "exit", 0),
    ([sys.executable, "-m", "testproject.embedded"], "kill-itself", 128 + signal.SIGKILL),
])
def test_a_client_killed_with_sigkill_leaves_no_server_once_the_last_live_user_exits(
        tmp_path: Path, through: list[str], ending: str, status: int) -> None:
    pgdata = tmp_path / "pgdata"
    run = subprocess.run([*through, sys.executable, "-c", COMMAND, CLIENT, ending], cwd=ROOT,
                         env=environment(pgdata), capture_output=True, text=True, timeout=300)
    assert run.returncode == status, run.stderr
    postmaster = int(run.stdout)
    wait_for(lambda: gone(postmaster), timeout=60)
    assert not (pgdata / "postmaster.pid").exists()
    assert users(pgdata) == []


def _in_group(process: psutil.Process, group: int) -> bool:
    try:
        return os.getpgid(process.pid) == group
    except OSError:
        return False


def _as_from_a_terminal() -> None:
    """Let SIGINT stop the command, as a terminal's Ctrl-C does.

    A suite started in the background of a non-interactive shell inherits SIGINT ignored, and an
    ignored signal stays ignored across exec: make and runserver would never see the Ctrl-C.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_make_admin_keeps_the_server_only_while_it_runs(tmp_path: Path) -> None:
    pgdata = tmp_path / "pgdata"
    port = free_port()
    venv = Path(sys.prefix)
    # This interpreter's virtualenv, never rebuilt by make.
    # Its output goes to a file: a pipe nobody reads while the test waits could fill and block
    # the server's exit.
    log = tmp_path / "admin.log"
    admin = subprocess.Popen(
        ["make", "--no-print-directory", "admin", f"ADMIN_PORT={port}", f"VENV={venv}",
         "-o", str(venv / ".installed")],
        cwd=ROOT, env=environment(pgdata), stdout=log.open("w"), stderr=subprocess.STDOUT,
        start_new_session=True, preexec_fn=_as_from_a_terminal,
    )

    def still_running() -> str:
        """What is left of the command's process group, and what it printed."""
        left = [f"{p.pid} {p.status()} {' '.join(p.cmdline())}"
                for p in psutil.process_iter() if _in_group(p, admin.pid)]
        return "\n".join(left) + "\n--- output:\n" + log.read_text()

    try:
        def serving() -> bool:
            assert admin.poll() is None, log.read_text()
            try:
                return urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/admin/login/", timeout=5).status == 200
            except OSError:
                return False

        wait_for(serving, timeout=300, interval=0.5)
        postmaster = int((pgdata / "postmaster.pid").read_text().split()[0])
        assert psutil.Process(postmaster).is_running()
        assert len(users(pgdata)) == 2  # the wrapper, and runserver
        # Ctrl-C in the terminal: SIGINT to the whole process group.
        os.killpg(admin.pid, signal.SIGINT)
        try:
            admin.wait(120)
        except subprocess.TimeoutExpired:
            pytest.fail(f"make admin still running 120 s after Ctrl-C:\n{still_running()}")
    finally:
        if admin.poll() is None:
            os.killpg(admin.pid, signal.SIGKILL)
            admin.wait(30)
    wait_for(lambda: gone(postmaster), timeout=120)
    assert not (pgdata / "postmaster.pid").exists()
    assert users(pgdata) == []


def test_a_command_run_through_the_wrapper_with_database_url_set_starts_no_server(
        tmp_path: Path) -> None:
    pgdata = tmp_path / "pgdata"
    env = environment(pgdata)
    env["DATABASE_URL"] = "postgres://postgres@127.0.0.1:1/unused"
    run = subprocess.run([sys.executable, "-m", "testproject.embedded", sys.executable, "-c",
                          "print('ran')"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=60)
    assert (run.returncode, run.stdout) == (0, "ran\n")
    assert not pgdata.exists()
