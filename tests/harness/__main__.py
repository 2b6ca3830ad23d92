"""Run the failure harness: ``python -m tests.harness [--profile ci|long] [--seed N]``.

It starts a private PostgreSQL server (never the one in DATABASE_URL: the harness crashes and
restarts its server), runs real workers against it, injects faults, checks the invariants and
prints the figures. The exit status is 0 only if every invariant held.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.harness", description=__doc__)
    parser.add_argument("--profile", choices=["ci", "long"], default="long")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the full report here")
    parser.add_argument("--keep", action="store_true",
                        help="keep the work directory (worker logs) after the run")
    parser.add_argument("--hold-snapshot", action="store_true",
                        help="hold a REPEATABLE READ snapshot open through the run (taken again "
                             "after each restart), so the workers claim from floors")
    args = parser.parse_args()

    from tests.harness.pool import TIMINGS
    from tests.harness.server import PrivateServer

    workdir = Path(tempfile.mkdtemp(prefix="pgjobs-chaos-"))
    server = PrivateServer(workdir)
    try:
        server.create_database("chaos")
        os.environ.pop("PGJOBS_DATABASE_NAME", None)
        os.environ.update(TIMINGS)
        os.environ["DATABASE_URL"] = server.url("chaos")
        os.environ["DJANGO_SETTINGS_MODULE"] = "testproject.settings"
        os.environ["PGJOBS_LOG_LEVEL"] = "INFO"
        if args.hold_snapshot:
            os.environ["PGJOBS_CLAIM_FLOORS_AFTER_SECONDS"] = "1"
        import django
        from django.core.management import call_command

        django.setup()
        call_command("migrate", verbosity=0)

        from tests.harness import runner

        record, checks, figures = runner.run(
            runner.PROFILES[args.profile], args.seed, server, workdir, dict(os.environ),
            hold_snapshot=args.hold_snapshot,
        )
        print(runner.render(record, checks, figures))
        if args.json:
            args.json.write_text(runner.to_json(record, checks, figures))
        if args.keep:
            print(f"\nworker logs: {workdir / 'logs'}")
        return 0 if all(c.ok for c in checks) and not record.notes else 1
    finally:
        server.close()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
