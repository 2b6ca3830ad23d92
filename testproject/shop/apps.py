from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "testproject.shop"
    label = "shop"
    verbose_name = "Sample shop"
    default_auto_field = "django.db.models.BigAutoField"
