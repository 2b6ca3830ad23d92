"""Workers on other hosts: drain and pickup with the workers a network hop from the server.

``python -m bench.remote [--quick]`` (as root: it makes network namespaces)

Four ``pgjobs_worker`` processes (one executor thread each) run in two network namespaces, two
in each (``bench.netns``), and reach PostgreSQL over TCP through their veth link and a delay
proxy (``bench.delay_proxy``) on this host's end of each link. The proxy adds 0, 1 or 5 ms to
every round trip; at 0 it is still a hop through a userspace proxy, since the server listens
on loopback only. The same four processes on this host, straight to the server over loopback,
come first as the baseline. For each placement and claim batch size (1, 10, 50):

- **drain**: no-op jobs are preloaded, as many as should last a few seconds, and the workers
  drain them in burst mode; the rate is taken between 5% and 95% done (``harness.drain``).
  Around the drain the harness reads the server's counters (``harness.ServerWork``): WAL
  written (the whole server's), transactions committed in the bench database (less the
  harness's own reads), rows written, and commits in the other databases meanwhile.
- **pickup**: the same workers, idle and listening, pick up probe jobs enqueued one at a time
  from this host; each handler reports its start over UDP to this host's end of link a. At the
  highest latency, once more with the workers given their queue (``--queue default``).

Each placement also times ``SELECT 1`` from where its workers run (pgbench), which is what the
added round trip comes to once the proxy's timers and the veth link are counted.

Every namespace and link is removed at the end, whatever happens, and at the start, in case an
earlier run crashed. Results go to bench/results/remote.json.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from bench import harness, netns, report
from bench.systems import PGJOBS

DATABASE = "bench_remote"
PROXY_PORT = 15432
PROCESSES_PER_HOST = 2
RTTS_MS = (0.0, 1.0, 5.0)
BATCHES = (1, 10, 50)
# Where the round trip costs most, also more executor threads per process at batch 10: how
# far concurrency hides the latency that a bigger batch would otherwise have to.
MORE_THREADS = 4
MORE_THREADS_FROM_RTT_MS = 1.0
RESULTS = harness.ROOT / "bench" / "results"
LOG = RESULTS / "logs" / "remote.log"
ROUND_TRIP_SQL = harness.ROOT / "bench" / "round_trip.sql"

# A worker's time per claimed batch on this machine with no added latency (4 local processes
# drained about 800, 5,400 and 10,800 jobs/s at batch 1, 10 and 50), and the round trips each
# batch waits on (the claim's BEGIN, statement and COMMIT; the settle). Only used to size the
# drains so each lasts about as long at every latency; the figures are measured.
LOCAL_MS_PER_BATCH = {1: 4.9, 10: 7.3, 50: 18.5}
ROUND_TRIPS_PER_BATCH = 4


@dataclass(frozen=True)
class Sizes:
    drain_seconds: float
    min_jobs: int
    pickup_samples: int
    round_trip_samples: int


QUICK = Sizes(drain_seconds=1.5, min_jobs=200, pickup_samples=8, round_trip_samples=50)
FULL = Sizes(drain_seconds=5.0, min_jobs=500, pickup_samples=50, round_trip_samples=200)


@dataclass(frozen=True)
class Placement:
    """Where the workers run: this host over loopback (rtt_ms None), or the namespaces."""

    rtt_ms: float | None

    @property
    def label(self) -> str:
        if self.rtt_ms is None:
            return "same host, loopback"
        return f"namespaces, +{self.rtt_ms:g} ms"

    def probe_env(self) -> dict[str, str]:
        return {} if self.rtt_ms is None else {"BENCH_PROBE_HOST": netns.LINKS[0].host_address}

    def commands(
        self, batch: int, threads: int, *, burst: bool, queue: str | None = None
    ) -> list[list[str]]:
        worker = PGJOBS.worker_command(burst=burst, concurrency=threads, batch=batch)
        if queue is not None:
            worker += ["--queue", queue]
        if self.rtt_ms is None:
            return [worker] * (PROCESSES_PER_HOST * len(netns.LINKS))
        return [link.run("env", f"BENCH_DATABASE_URL={proxied_dsn(link)}", *worker)
                for link in netns.LINKS for _ in range(PROCESSES_PER_HOST)]


def proxied_dsn(link: netns.Link) -> str:
    """The bench database's URL as a worker in ``link``'s namespace reaches it: the proxy."""
    parts = urlsplit(harness.dsn(DATABASE))
    user, at, _ = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{user}{at}{link.host_address}:{PROXY_PORT}"))


def jobs_for(batch: int, threads: int, rtt_ms: float, sizes: Sizes) -> int:
    """Enough jobs for a drain of about ``sizes.drain_seconds`` at this shape and latency."""
    processes = PROCESSES_PER_HOST * len(netns.LINKS)
    ms_per_batch = LOCAL_MS_PER_BATCH[batch] + ROUND_TRIPS_PER_BATCH * rtt_ms
    # More threads than one per process wait on more round trips at once, up to what the
    # machine's CPU drains locally.
    expected_per_s = 1000 * batch * min(processes / LOCAL_MS_PER_BATCH[batch],
                                        processes * threads / ms_per_batch)
    return max(sizes.min_jobs, math.ceil(expected_per_s * sizes.drain_seconds / 100) * 100)


@contextmanager
def delay_proxy(rtt_ms: float) -> Iterator[subprocess.Popen[bytes]]:
    """The proxy on this host's end of every link, forwarding to the server."""
    server = urlsplit(harness.SERVER_URL)
    command = [harness.PYTHON, "-m", "bench.delay_proxy", "--rtt-ms", str(rtt_ms),
               "--upstream", f"{server.hostname}:{server.port or 5432}"]
    for link in netns.LINKS:
        command += ["--listen", f"{link.host_address}:{PROXY_PORT}"]
    LOG.parent.mkdir(parents=True, exist_ok=True)
    with LOG.open("ab") as log:
        proxy = subprocess.Popen(command, cwd=harness.ROOT, stdout=subprocess.PIPE, stderr=log)
    try:
        assert proxy.stdout is not None
        if proxy.stdout.readline().strip() != b"listening":
            raise RuntimeError(f"the delay proxy did not start; see {LOG}")
        yield proxy
    finally:
        harness.stop_process(proxy, timeout=10)


def round_trip_ms(placement: Placement, samples: int) -> float:
    """The mean time of ``SELECT 1`` from where the workers run, by pgbench."""
    pgbench = shutil.which("pgbench")
    if pgbench is None:
        raise RuntimeError("pgbench is not installed (Debian: postgresql-client)")
    command = [pgbench, "-n", "-f", str(ROUND_TRIP_SQL), "-t", str(samples)]
    if placement.rtt_ms is None:
        command.append(harness.dsn(DATABASE))
    else:
        command = netns.LINKS[0].run(*command, proxied_dsn(netns.LINKS[0]))
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    match = re.search(r"latency average = ([\d.]+) ms", output)
    if match is None:
        raise RuntimeError(f"no latency in pgbench output:\n{output}")
    return float(match.group(1))


def measure(
    placement: Placement, batch: int, threads: int, sizes: Sizes, startup_cpu: float,
    proxy: subprocess.Popen[bytes] | None,
) -> dict[str, Any]:
    """Drain at this shape (the server's counters are read around it), then the pickup."""
    rtt = placement.rtt_ms or 0.0
    jobs = jobs_for(batch, threads, rtt, sizes)
    env = placement.probe_env()
    harness.measure("pgjobs", "reset", DATABASE)
    harness.measure("pgjobs", "preload", DATABASE, n=jobs)
    proxy_before = harness.process_cpu_seconds(proxy.pid) if proxy else None
    drained = harness.drain(
        DATABASE, PGJOBS.remaining_sql, jobs, placement.commands(batch, threads, burst=True),
        LOG,
        timeout=60 + 10 * sizes.drain_seconds, startup_cpu_seconds=startup_cpu, env=env,
    )
    proxy_after = harness.process_cpu_seconds(proxy.pid) if proxy else None
    proxy_cpu = (proxy_after - proxy_before
                 if proxy_after is not None and proxy_before is not None else None)
    latency = pickup(placement, batch, threads, sizes)
    return {
        "placement": placement.label, "rtt_ms": placement.rtt_ms, "batch": batch,
        "threads": threads,
        **drained.as_dict(),
        "proxy_cpu_us_per_job": proxy_cpu / jobs * 1e6 if proxy_cpu is not None else None,
        "pickup": latency,
    }


def pickup(
    placement: Placement, batch: int, threads: int, sizes: Sizes, queue: str | None = None
) -> dict[str, Any]:
    """Pickup latency of the same workers, idle and listening, one probe job at a time."""
    env = placement.probe_env()
    harness.measure("pgjobs", "reset", DATABASE)
    workers = harness.Workers.start(
        placement.commands(batch, threads, burst=False, queue=queue),
        harness.child_env(DATABASE, **env), LOG,
    )
    try:
        return harness.measure("pgjobs", "pickup", DATABASE, env=env,
                               samples=sizes.pickup_samples)
    finally:
        workers.stop()


def run(sizes: Sizes, batches: Sequence[int]) -> dict[str, Any]:
    harness.recreate_database(DATABASE)
    harness.manage(DATABASE, "migrate", "--verbosity", "0")
    # CPU is CPU wherever the process runs: start-up is measured once, on this host.
    startup_cpu = harness.startup_cpu(
        DATABASE, PGJOBS.worker_command(burst=True, concurrency=1, batch=10), LOG, {}
    )
    rows = []
    named: dict[str, Any] | None = None
    for placement in [Placement(None), *(Placement(rtt) for rtt in RTTS_MS)]:
        hop = nullcontext() if placement.rtt_ms is None else delay_proxy(placement.rtt_ms)
        with hop as proxy:
            select_ms = round_trip_ms(placement, sizes.round_trip_samples)
            shapes = [(batch, 1) for batch in batches]
            if placement.rtt_ms is not None and placement.rtt_ms >= MORE_THREADS_FROM_RTT_MS:
                shapes.append((10, MORE_THREADS))
            for batch, threads in shapes:
                log(f"{placement.label}, batch {batch}, {threads} thread(s) per process")
                row = measure(placement, batch, threads, sizes, startup_cpu, proxy)
                rows.append({**row, "select_1_ms": select_ms})
                log(f"  {row['jobs_per_s']:,.0f} jobs/s, pickup p50 "
                    f"{row['pickup']['p50_ms']:.1f} ms")
            if placement.rtt_ms == max(RTTS_MS):
                # A worker serving every queue reads which have work before it claims after an
                # idle spell; one given its queue goes straight to the claim.
                log(f"{placement.label}, pickup with --queue default")
                named = {"placement": placement.label, "rtt_ms": placement.rtt_ms, "batch": 10,
                         "pickup": pickup(placement, 10, 1, sizes, queue="default")}
    harness.measure("pgjobs", "reset", DATABASE)
    return {"rows": rows, "pickup_named_queue": named}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # so the namespaces come down on the way out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, to check the scenario")
    parser.add_argument("--output", type=Path, default=RESULTS / "remote.json")
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    from bench.run import machine

    started = time.monotonic()
    results: dict[str, Any] = {"quick": args.quick, "machine": machine(),
                               "sizes": sizes.__dict__,
                               "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    log("creating network namespaces " + ", ".join(link.namespace for link in netns.LINKS))
    try:
        netns.create()
    except netns.NamespacesUnavailable as exc:
        print(f"bench.remote: cannot run workers in network namespaces: {exc}", file=sys.stderr)
        sys.exit(2)
    try:
        results.update(run(sizes, BATCHES))
    finally:
        netns.remove()
        log("network namespaces removed")
    results["seconds"] = round(time.monotonic() - started)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2))
    print(report.render_remote(results))
    log(f"done in {results['seconds']} s; results in {args.output}")


if __name__ == "__main__":
    main()
