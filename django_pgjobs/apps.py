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

        registry.enqueuer = enqueue

        for module in settings.HANDLER_MODULES:
            autodiscover_modules(module)
        # The django.tasks integration resolves the names of @task functions for workers; without
        # Django 6 or the django-tasks backport there is no @task to run.
        with contextlib.suppress(ImportError):
            from . import backend  # noqa: F401
