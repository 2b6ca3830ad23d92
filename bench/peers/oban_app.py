"""Oban for Python: the same no-op and pickup jobs, for its own worker command.

Oban needs Python 3.12 or newer, so this module is imported only by processes of the Oban
virtualenv (bench/requirements-oban.txt): its workers and its client (bench/clients/oban.py),
never by the runner. Workers run through Oban's CLI, one process each (see ``OBAN`` in
bench/systems.py): ``oban start --dsn ... --queues default:10 --cron-modules
bench.peers.oban_app --log-level WARNING``. A worker resolves a job's worker by importing the
dotted path the job's row names (``bench.peers.oban_app.noop``), which PYTHONPATH makes
importable; ``--cron-modules`` names this module, so the CLI imports it at start-up instead of
grepping the whole checkout for cron workers (its default, with no cron worker to find here).
"""

from __future__ import annotations

from oban import job

from bench.probe import report_start


@job()
async def noop(n: int) -> None:
    """Do nothing."""


@job()
async def pickup(n: int, port: int) -> None:
    """Report the moment this job started."""
    report_start(n, port)
