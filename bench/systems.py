"""The systems under test: where each keeps its jobs and how its workers are started."""

from __future__ import annotations

from dataclasses import dataclass, field

from bench import harness


@dataclass(frozen=True)
class System:
    name: str
    database: str
    remaining_sql: str
    # Which client and worker: the name, unless this is a variant of another system.
    kind: str = ""
    env: dict[str, str] = field(default_factory=dict)

    @property
    def client(self) -> str:
        return self.kind or self.name

    def worker_command(
        self, *, burst: bool, concurrency: int = 1, batch: int = 10
    ) -> list[str]:
        py, manage = harness.PYTHON, harness.MANAGE
        if self.client == "pgjobs":
            return [py, manage, "pgjobs_worker", "--concurrency", str(concurrency),
                    "--batch-size", str(batch), "--log-level", "WARNING",
                    *(["--burst"] if burst else [])]
        if self.client == "django-tasks-db":
            return [py, manage, "db_worker", "--no-startup-delay", "--no-reload",
                    *(["--batch"] if burst else [])]
        if self.client == "procrastinate":
            return [py, "-m", "bench.peers.procrastinate_app", "--concurrency", str(concurrency),
                    *(["--burst"] if burst else [])]
        if self.client == "pgqueuer":
            return [py, "-m", "bench.peers.pgqueuer_peer", "--dsn", harness.dsn(self.database),
                    "--batch-size", str(batch), *(["--burst"] if burst else [])]
        raise ValueError(f"no worker for {self.name}")


PGJOBS = System(
    "pgjobs", "bench_pgjobs",
    "SELECT count(*) FROM pgjobs_job WHERE status IN ('ready', 'running')",
)
# The same code with Django's server_side_binding option: parameters travel apart from the SQL
# (nothing is prepared, not even the claim and settle pgjobs prepares by default; see
# bench/settings.py).
PGJOBS_SERVER_BINDING = System(
    "pgjobs (server-side binding)", PGJOBS.database, PGJOBS.remaining_sql, kind="pgjobs",
    env={"BENCH_SERVER_SIDE_BINDING": "1"},
)
# The same code with the claim's BEGIN and COMMIT sent apart, as psycopg sends them by itself
# (bench/experiments.py patches it in).
PGJOBS_CLAIM_APART = System(
    "pgjobs (BEGIN and COMMIT apart)", PGJOBS.database, PGJOBS.remaining_sql, kind="pgjobs",
    env={"BENCH_EXPERIMENT": "claim_begin_commit_apart"},
)
# The claim without its probe of pgjobs_queue, to price the pause check (bench/experiments.py).
PGJOBS_CLAIM_NO_PAUSE = System(
    "pgjobs (claim without the pause check)", PGJOBS.database, PGJOBS.remaining_sql,
    kind="pgjobs", env={"BENCH_EXPERIMENT": "claim_without_pause"},
)
DJANGO_TASKS_DB = System(
    "django-tasks-db", "bench_dtd",
    "SELECT count(*) FROM django_tasks_database_dbtaskresult WHERE status IN ('READY', 'RUNNING')",
)
PROCRASTINATE = System(
    "procrastinate", "bench_proc",
    "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')",
)
PGQUEUER = System("pgqueuer", "bench_pgq", "SELECT count(*) FROM pgqueuer")
FLOOR_DATABASE = "bench_floor"

PEERS = [DJANGO_TASKS_DB, PROCRASTINATE, PGQUEUER]
ALL = [PGJOBS, *PEERS]
