"""Child-process entry: ``python -m bench.measure SYSTEM ACTION '<json kwargs>'``.

Each system's client runs in a process of its own, against a database of its own, and answers
with one JSON line on stdout; the parent (``bench.run``) only orchestrates and prints.
"""

from __future__ import annotations

import importlib
import json
import sys

CLIENTS = {
    "pgjobs": "bench.clients.pgjobs",
    "django-tasks-db": "bench.clients.django_tasks_db",
    "procrastinate": "bench.clients.procrastinate",
    "pgqueuer": "bench.clients.pgqueuer",
    "chancy": "bench.clients.chancy",
    # Run by the Oban virtualenv's interpreter (Python 3.12+), never the runner's.
    "oban": "bench.clients.oban",
}
DJANGO_SYSTEMS = {"pgjobs", "django-tasks-db"}


def main() -> None:
    system, action, raw = sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "{}"
    if system in DJANGO_SYSTEMS:
        import django

        django.setup()
    client = importlib.import_module(CLIENTS[system])
    result = getattr(client, action)(**json.loads(raw))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
