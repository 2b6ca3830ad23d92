from django.apps import AppConfig


class BenchConfig(AppConfig):
    name = "bench"

    def ready(self) -> None:
        from .experiments import apply_from_environment

        apply_from_environment()
