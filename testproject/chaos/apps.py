from django.apps import AppConfig


class ChaosConfig(AppConfig):
    name = "testproject.chaos"
    label = "chaos"
    verbose_name = "Failure harness workload"
    default_auto_field = "django.db.models.BigAutoField"
