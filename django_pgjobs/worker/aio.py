"""Async handlers: one event loop per worker process runs them, many at once.

An executor thread that meets an ``async def`` handler hands the job to the loop and goes on
with its batch; a semaphore of ``async_concurrency`` places makes it wait when the loop is full,
so a worker never holds more async jobs than it can run. Each job is a task on the loop with the
same lease, heartbeats, fenced settlement, timeout and cancellation as a thread's job; the worker
cancels the task to stop it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from concurrent.futures import Future

from asgiref.sync import sync_to_async
from django.db import connections

from ..claimed import ClaimedJob
from ..context import JobContext
from ..executor import aexecute
from .running import RunningJob, RunningJobs, failed_around
from .settler import Settler

logger = logging.getLogger("django_pgjobs.worker")

DEFAULT_ASYNC_CONCURRENCY = 50


class AsyncRunner:
    """The worker's event loop, in a thread of its own, started on the first async job."""

    def __init__(
        self, settler: Settler, running: RunningJobs, *, concurrency: int, worker_id: str,
        using: str,
    ) -> None:
        self.settler = settler
        self.running = running
        self.concurrency = concurrency
        self.worker_id = worker_id
        self.using = using
        self._places = threading.BoundedSemaphore(concurrency)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._futures: set[Future[None]] = set()

    def submit(self, job: ClaimedJob, ctx: JobContext, *, heartbeat: bool) -> None:
        """Run ``job`` on the loop; wait first while the loop has no place for it."""
        self._places.acquire()
        loop = self._started()
        future = asyncio.run_coroutine_threadsafe(self._run(job, ctx, heartbeat), loop)
        with self._lock:
            self._futures.add(future)
        future.add_done_callback(self._done)

    def in_flight(self) -> int:
        with self._lock:
            return len(self._futures)

    def stop(self, *, deadline: float) -> None:
        """Let running jobs finish until ``deadline`` (monotonic), then cancel the rest.

        A cancelled job's lease expires and the rescue step takes it, as after any shutdown.
        """
        if self._loop is None:
            return
        while self.in_flight() and time.monotonic() < deadline:
            time.sleep(0.02)
        with self._lock:
            left = list(self._futures)
        for future in left:
            future.cancel()
        # The async ORM ran its queries in asgiref's thread for sync code: close its connections.
        closing = asyncio.run_coroutine_threadsafe(
            sync_to_async(connections.close_all, thread_sensitive=True)(), self._loop)
        with contextlib.suppress(Exception):
            closing.result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(5)

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._serve, name="pgjobs-async",
                                                daemon=True)
                self._thread.start()
            return self._loop

    def _serve(self) -> None:
        assert self._loop is not None
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            connections.close_all()

    async def _run(self, job: ClaimedJob, ctx: JobContext, heartbeat: bool) -> None:
        task = asyncio.current_task()
        assert task is not None and self._loop is not None
        loop = self._loop

        def stop() -> None:
            loop.call_soon_threadsafe(task.cancel)

        with self.running.tracking(RunningJob(job, ctx, time.monotonic(), stop=stop),
                                   heartbeat=heartbeat):
            try:
                outcome = await aexecute(job, ctx)
            except Exception as exc:  # the worker's own code failed: the job's failure
                outcome = failed_around(job, exc, worker_id=self.worker_id)
        self.settler.put(ctx.settlement(outcome))

    def _done(self, future: Future[None]) -> None:
        with self._lock:
            self._futures.discard(future)
        self._places.release()
        if not future.cancelled() and future.exception() is not None:
            # The type only: an exception's text may quote a payload, which logs must not show.
            logger.error("worker.async worker=%s: a job's task failed outside its handler: %s",
                         self.worker_id, type(future.exception()).__qualname__)


__all__ = ["DEFAULT_ASYNC_CONCURRENCY", "AsyncRunner"]
