"""Settings for the demo and the test suite.

DATABASE_URL picks the PostgreSQL server; without it an embedded server starts with its data in
.pgdata/ at the repository root (testproject/embedded.py says who starts and stops it).
"""

from pathlib import Path

import django
import environ

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()

SECRET_KEY = env.str("DJANGO_SECRET_KEY", default="pgjobs-testproject-not-secret")
DEBUG = env.bool("DJANGO_DEBUG", default=False)
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "testserver"]

if env.str("DATABASE_URL", default=""):
    DATABASES = {"default": env.db_url("DATABASE_URL")}
else:
    from testproject.embedded import embedded_database, embedded_pgdata

    DATABASES = {"default": embedded_database(embedded_pgdata())}
# Worker processes started by the tests connect to the test database by this name.
if env.str("PGJOBS_DATABASE_NAME", default=""):
    DATABASES["default"]["NAME"] = env.str("PGJOBS_DATABASE_NAME")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_pgjobs",
    "testproject.demo",
    "testproject.chaos",
    "testproject.shop",
]
try:
    import django.tasks
except ImportError:  # Django < 6: django.tasks comes from the django-tasks backport, an app
    INSTALLED_APPS.append("django_tasks")

# @task functions (django.tasks) run as django-pgjobs jobs; QUEUES [] accepts any queue name.
TASKS = {
    "default": {
        "BACKEND": "django_pgjobs.backend.PgJobsBackend",
        "QUEUES": [],
    }
}

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "testproject.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

# The sample shop sends receipts by email: to the console outside tests (Django's test runner
# swaps in its in-memory outbox). Django 6.1 names mailers in MAILERS and refuses EMAIL_BACKEND
# beside it; older versions read EMAIL_BACKEND.
if django.VERSION >= (6, 1):
    MAILERS = {"default": {"BACKEND": "django.core.mail.backends.console.EmailBackend"}}
else:
    EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"

USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Short waits so the demo's retries finish within its minute.
PGJOBS_RETRY_BASE_SECONDS = env.float("PGJOBS_RETRY_BASE_SECONDS", default=0.05)
PGJOBS_RETRY_MAX_SECONDS = env.float("PGJOBS_RETRY_MAX_SECONDS", default=1.0)
PGJOBS_RESCUE_INTERVAL_SECONDS = env.float("PGJOBS_RESCUE_INTERVAL_SECONDS", default=0.5)
PGJOBS_POLL_INTERVAL_SECONDS = env.float("PGJOBS_POLL_INTERVAL_SECONDS", default=0.2)
# The failure harness's --hold-snapshot run turns claim floors on within a second.
PGJOBS_CLAIM_FLOORS_AFTER_SECONDS = env.float("PGJOBS_CLAIM_FLOORS_AFTER_SECONDS", default=30.0)
# Jobs of a killed demo worker come back after this lease instead of the default 30 s.
PGJOBS_LEASE_SECONDS = env.int("PGJOBS_LEASE_SECONDS", default=5)
# The key of the project's encrypted fields, for the tests and the demo only: a real project
# keeps its keys out of its code (an environment variable, a secret store). The first encrypts.
PGJOBS_ENCRYPTION_KEYS = env.list(
    "PGJOBS_ENCRYPTION_KEYS", default=["WQFACUKYJb8ZRROhPLuY4r92iwCrWS-nVlCFjbyazs0="])
# A test points a burst worker at a closed port and shortens how long it keeps trying.
if env.str("PGJOBS_BURST_UNREACHABLE_SECONDS", default=""):
    PGJOBS_BURST_UNREACHABLE_SECONDS = env.float("PGJOBS_BURST_UNREACHABLE_SECONDS")

# The PgBouncer test forces prepared statements on behind transaction pooling.
if env.str("PGJOBS_PREPARED_STATEMENTS", default=""):
    PGJOBS_PREPARED_STATEMENTS = env.bool("PGJOBS_PREPARED_STATEMENTS")

# The schedule tests run workers that look for due ticks often and miss them after a short grace.
# make demo samples the queues' history every few seconds, so its short run draws a chart.
for _name in ("PGJOBS_SCHEDULE_INTERVAL_SECONDS", "PGJOBS_SCHEDULE_GRACE_SECONDS",
              "PGJOBS_HISTORY_INTERVAL_SECONDS"):
    if env.str(_name, default=""):
        globals()[_name] = env.float(_name)
if env.str("PGJOBS_SCHEDULES", default=""):
    PGJOBS_SCHEDULES = env.json("PGJOBS_SCHEDULES")
# make demo and make admin set a backlog policy, so the dashboard checks one.
if env.str("PGJOBS_BACKLOG_MAX_AGE_SECONDS", default=""):
    PGJOBS_BACKLOG_MAX_AGE_SECONDS = env.json("PGJOBS_BACKLOG_MAX_AGE_SECONDS")

# The test suite asks a worker that does not exit in time where each of its threads is.
if env.bool("PGJOBS_DUMP_STACKS_ON_SIGUSR2", default=False):
    import faulthandler
    import signal

    faulthandler.register(signal.SIGUSR2, all_threads=True)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "django_pgjobs": {"handlers": ["stderr"], "level": env.str("PGJOBS_LOG_LEVEL", "WARNING")},
    },
}
