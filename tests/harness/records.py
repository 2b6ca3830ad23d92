"""What a harness run did, kept for the invariant checks and the report."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from tests.harness.pool import Exit

PLAIN = "chaos.plain_effect"
RECEIPTED = "chaos.receipted_effect"
TICK = "chaos.tick"
POISON = "chaos.poison"
QUEUED = "chaos.queued"
SCHEDULED = "chaos.scheduled"
# At most LIMITED_RUNNING of its jobs with one group run at once (a Limit of its handler).
LIMITED = "chaos.limited"
LIMITED_RUNNING = 2
# At most RATED_PER_SECOND of its jobs with one group start a second, RATED_BURST at once (a Rate).
RATED = "chaos.rated"
RATED_PER_SECOND = 5
RATED_BURST = 2


@dataclass
class Fault:
    """One fault the harness injected."""

    kind: str  # kill, stop, disconnect, restart
    origin: str  # the targeted scenario's name, or "random"
    at: datetime  # the database clock just before the fault
    worker_id: str = ""  # empty for a database restart
    # Jobs that had a running attempt on the struck worker at that moment.
    interrupted: list[int] = field(default_factory=list)
    detail: str = ""


@dataclass
class Target:
    """A targeted fault: one job held still at a known point, then struck."""

    name: str
    fault: str  # kill, stop, disconnect
    task: str
    hold: str  # before_effect, after_effect
    key: str
    job_id: int
    struck: bool = False  # the fault landed while the job was holding
    worker_id: str = ""
    at: datetime | None = None
    # stop: the stopped worker was resumed only after another worker finished the job.
    resumed_after_takeover: bool = False
    # disconnect: the same worker process later claimed and finished another job.
    worker_went_on: bool = False


@dataclass
class Restart:
    at: datetime
    down_seconds: float
    workers_before: list[str]
    # Workers from before the restart still alive when the harness looked (none was killed).
    workers_expected: list[str] = field(default_factory=list)
    # Of those, the ones (same processes) that claimed and finished a job after the restart.
    workers_resumed: list[str] = field(default_factory=list)


@dataclass
class Flood:
    ordinary_keys: list[str] = field(default_factory=list)
    flood_keys: list[str] = field(default_factory=list)
    flood_started: datetime | None = None
    flood_ended: datetime | None = None  # the last flood job was enqueued
    poison_keys: list[str] = field(default_factory=list)


@dataclass
class Lifecycle:
    """The lifecycle controls the harness exercised while faults went on."""

    timed_out_keys: list[str] = field(default_factory=list)  # handlers that never return
    cancelled_keys: list[str] = field(default_factory=list)  # cancelled while they ran
    paused_queue: str = ""
    paused_keys: list[str] = field(default_factory=list)  # enqueued onto the paused queue
    paused_at: datetime | None = None  # the pause had committed by then
    resumed_at: datetime | None = None  # the resume had not started before then
    # Jobs claimed in batches behind slower ones; some cancelled while claimed, not started.
    queued_keys: list[str] = field(default_factory=list)
    queued_cancelled_keys: list[str] = field(default_factory=list)


@dataclass
class OrphanCheck:
    """A worker killed while its process-isolated handler wrote effects, one after another."""

    key: str
    job_id: int
    worker_id: str = ""
    # Set once the worker was dead and no connection of it (its child's included) was running
    # a statement: the highest Effect id then. No effect of the job by that worker may follow.
    last_effect_id: int | None = None
    # The worker's connections were still there long after its death: a child outlived it.
    connections_outlived_worker: bool = False


@dataclass
class ScheduleEdits:
    """Operators' edits of schedules while the workers enqueued their ticks."""

    names: list[str] = field(default_factory=list)
    edits: dict[str, int] = field(default_factory=dict)  # kind -> how many were saved
    # Saved after a worker had enqueued a tick of the schedule since the edit read it.
    saved_over_a_tick: int = 0


@dataclass
class Replays:
    """Enqueues repeated under the same idempotency keys: key -> [(job id, created)]."""

    calls: dict[str, list[tuple[int, bool]]] = field(default_factory=dict)


@dataclass
class RunRecord:
    profile: str
    seed: int
    workers: int
    concurrency: int
    started_at: datetime | None = None
    faults: list[Fault] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    restarts: list[Restart] = field(default_factory=list)
    flood: Flood = field(default_factory=Flood)
    replays: Replays = field(default_factory=Replays)
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    orphans: list[OrphanCheck] = field(default_factory=list)
    schedules: ScheduleEdits = field(default_factory=ScheduleEdits)
    bulk_keys: list[str] = field(default_factory=list)
    limited_keys: list[str] = field(default_factory=list)
    later_keys: list[str] = field(default_factory=list)
    # Workflows' jobs, and of them the chords' callbacks.
    workflow_keys: list[str] = field(default_factory=list)
    callback_keys: list[str] = field(default_factory=list)
    exits: list[Exit] = field(default_factory=list)
    shutdown_codes: dict[str, int | None] = field(default_factory=dict)
    drained: bool = False
    wall_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
