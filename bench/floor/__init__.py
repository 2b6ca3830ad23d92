"""The pgbench floor: the minimal SQL a SKIP LOCKED queue needs per job, with no framework.

Insert; claim a batch; settle the batch fenced by its lease tokens. pgbench runs it with
prepared statements, so the figures are what the server and the protocol allow on this machine.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from bench import harness

HERE = Path(__file__).resolve().parent
REMAINING_SQL = "SELECT count(*) FROM floor_job WHERE status IN ('ready', 'running')"


def _pgbench(database: str, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    pgbench = shutil.which("pgbench")
    if pgbench is None:
        raise RuntimeError("pgbench is not installed (Debian: postgresql-client)")
    return subprocess.run(
        [pgbench, "-n", "-M", "prepared", "-f", str(HERE / script), *args,
         harness.dsn(database)],
        capture_output=True, text=True, check=True,
    )


def _tps(output: str) -> float:
    match = re.search(r"tps = ([\d.]+) \(without initial connection time\)", output)
    if match is None:
        raise RuntimeError(f"no tps in pgbench output:\n{output}")
    return float(match.group(1))


def setup(database: str) -> None:
    harness.execute(database, (HERE / "schema.sql").read_text())


def reset(database: str) -> None:
    harness.execute(database, "TRUNCATE floor_job RESTART IDENTITY")


def enqueue_single(database: str, n: int) -> dict[str, Any]:
    tps = _tps(_pgbench(database, "insert.sql", "-c", "1", "-t", str(n)).stdout)
    reset(database)
    return {"floor": tps}


def enqueue_bulk(database: str, n: int, chunk: int = 1000) -> dict[str, Any]:
    runs = max(1, n // chunk)
    tps = _tps(_pgbench(database, "insert_bulk.sql", "-c", "1", "-t", str(runs),
                        "-D", f"chunk={chunk}").stdout)
    reset(database)
    return {"floor": tps * chunk}


def preload(database: str, n: int) -> None:
    harness.execute(
        database,
        "INSERT INTO floor_job (payload) "
        "SELECT jsonb_build_object('n', g) FROM generate_series(1, %s) AS g",
        [n],
    )


def drain_command(database: str, jobs: int, clients: int, batch: int) -> list[str]:
    """pgbench with ``clients`` connections, each claiming ``batch`` and settling the batch."""
    # Enough transactions for every client to keep claiming until the queue is empty.
    per_client = jobs // (clients * batch) + 50
    return [
        shutil.which("pgbench") or "pgbench", "-n", "-M", "prepared",
        "-f", str(HERE / "claim_settle.sql"), "-c", str(clients), "-j", str(min(clients, 2)),
        "-t", str(per_client), "-D", f"batch={batch}", harness.dsn(database),
    ]
