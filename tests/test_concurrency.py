from __future__ import annotations

import threading
from collections import Counter

import pytest
from django.db import connections

import django_pgjobs
from django_pgjobs.enqueuing import JobSpec
from django_pgjobs.models import Job
from django_pgjobs.transitions import claim_jobs

pytestmark = pytest.mark.django_db(transaction=True)


def test_many_threads_on_separate_connections_never_claim_the_same_job_twice() -> None:
    total, threads = 3000, 8
    django_pgjobs.enqueue_many(
        [JobSpec.of("tests.ok", {"i": i}, priority=i % 7, queue="bulk") for i in range(total)]
    )
    claimed: list[list[int]] = [[] for _ in range(threads)]
    start = threading.Barrier(threads)

    def claimer(index: int) -> None:
        try:
            start.wait()
            while True:
                batch = claim_jobs(f"w{index}", "bulk", 7)
                if not batch:
                    return
                claimed[index].extend(job.id for job in batch)
        finally:
            connections.close_all()

    workers = [threading.Thread(target=claimer, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    all_ids = [job_id for ids in claimed for job_id in ids]
    duplicates = [job_id for job_id, n in Counter(all_ids).items() if n > 1]
    assert duplicates == []
    assert len(all_ids) == total
    assert sum(1 for ids in claimed if ids) > 1  # the work really was shared
    # Each job is held by the thread whose claim returned it, and by no one else.
    owners = dict(Job.objects.filter(queue="bulk", status="running")
                  .values_list("id", "lease_owner"))
    assert owners == {job_id: f"w{index}" for index, ids in enumerate(claimed) for job_id in ids}
