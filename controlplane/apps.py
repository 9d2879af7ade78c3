from django.apps import AppConfig


class ControlPlaneConfig(AppConfig):
    name = "controlplane"
    verbose_name = "PEARL control plane"
    default_auto_field = "django.db.models.BigAutoField"
