import contextlib

from django.apps import AppConfig


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
        # The django.tasks integration resolves the names of @task functions for workers; without
        # Django 6 or the django-tasks backport there is no @task to run.
        with contextlib.suppress(ImportError):
            from . import backend  # noqa: F401
