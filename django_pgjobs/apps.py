from __future__ import annotations

from typing import TYPE_CHECKING

from django.apps import AppConfig

from .registry import DJANGO_TASK_PREFIX

if TYPE_CHECKING:
    from .registry import Handler


class PgJobsConfig(AppConfig):
    name = "django_pgjobs"
    label = "pgjobs"
    verbose_name = "Job queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.utils.module_loading import autodiscover_modules

        from . import checks  # noqa: F401  (registers the system checks)
        from .conf import settings
        from .enqueuing import enqueue
        from .registry import registry
        from .validation import setting_problem

        registry.enqueuer = enqueue

        # A value the checks refuse (5, "jobs") discovers nothing, so that start-up goes on to
        # the checks, which report it as pgjobs.E010, instead of failing on it here.
        modules = settings.HANDLER_MODULES
        if setting_problem("HANDLER_MODULES", modules) is None:
            for module in modules:
                autodiscover_modules(module)
        # The django.tasks integration resolves the names of @task functions for workers. It is
        # imported at the first such name, not here: a project that uses no @task does not pay
        # for Django's task framework (the backport's import is a twentieth of a worker's
        # start-up), and without Django 6 or the backport there is no @task to run.
        registry.add_resolver(DJANGO_TASK_PREFIX, _resolve_task)


def _resolve_task(name: str, may_import: bool) -> Handler | None:
    try:
        from .backend.runner import resolve_handler
    except ImportError:
        return None
    return resolve_handler(name, may_import)
