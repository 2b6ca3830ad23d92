"""Django settings for the benchmark processes: django-pgjobs and django-tasks-db side by side.

BENCH_DATABASE_URL names the server (default: the local one), BENCH_DB_NAME the database, so
each system under test gets a database of its own on the same server. django-pgjobs keeps its
library defaults; only what a benchmark must pin is set here, each line saying why.
"""

from __future__ import annotations

import json
import os

import environ

env = environ.Env()

SECRET_KEY = "pgjobs-bench-not-secret"
DEBUG = False  # DEBUG keeps every query in memory: a worker would grow without bound
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {
    "default": env.db_url(
        "BENCH_DATABASE_URL", default="postgres://postgres@127.0.0.1:5432/bench_pgjobs"
    )
}
if os.environ.get("BENCH_DB_NAME"):
    DATABASES["default"]["NAME"] = os.environ["BENCH_DB_NAME"]
# BENCH_SERVER_SIDE_BINDING=1 measures Django's psycopg option that sends parameters apart from
# the SQL. It prepares nothing: Django sets psycopg's prepare_threshold to None unless OPTIONS
# name one, and pgjobs sends its claim and settle in full there (EXECUTE takes SQL literals),
# so the server plans every statement.
if env.bool("BENCH_SERVER_SIDE_BINDING", default=False):
    DATABASES["default"].setdefault("OPTIONS", {})["server_side_binding"] = True

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_tasks_db",
    "django_pgjobs",
    "bench",
]
try:  # Django 6 ships django.tasks; on 5.2 django-tasks-db needs the backport app
    import django.tasks  # noqa: F401
except ImportError:
    INSTALLED_APPS.insert(2, "django_tasks")

TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}

# A worker or client of one of the two (BENCH_APPS, set by bench/systems.py) loads that one's
# apps only, as a project that uses one queue does: neither pays for importing the other at
# start-up. The runner and the migrations load both.
_ONLY = {"pgjobs": {"django_tasks", "django_tasks_db"}, "django-tasks-db": {"django_pgjobs"}}
INSTALLED_APPS = [app for app in INSTALLED_APPS
                  if app not in _ONLY.get(os.environ.get("BENCH_APPS", ""), set())]
if "django_tasks_db" not in INSTALLED_APPS:
    TASKS = {}

# Overrides for one run (the soak shortens retention this way), as JSON settings names/values.
for _name, _value in json.loads(os.environ.get("BENCH_PGJOBS_SETTINGS", "{}")).items():
    if not _name.startswith("PGJOBS_"):
        raise ValueError(f"BENCH_PGJOBS_SETTINGS may only set PGJOBS_* settings, not {_name}")
    globals()[_name] = _value

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    # Per-job INFO lines would make the benchmark measure logging.
    "loggers": {
        "django_pgjobs": {"handlers": ["stderr"], "level": "WARNING", "propagate": False},
        "django.tasks": {"handlers": ["stderr"], "level": "WARNING", "propagate": False},
        "django_tasks": {"handlers": ["stderr"], "level": "WARNING", "propagate": False},
        "django_tasks_db": {"handlers": ["stderr"], "level": "WARNING", "propagate": False},
    },
}
