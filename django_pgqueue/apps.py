from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class PgQueueConfig(AppConfig):
    name = "django_pgqueue"
    label = "django_pgqueue"
    verbose_name = "Job queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core.signals import request_finished

        from . import checks  # noqa: F401  (registers the system checks)
        from .sideconn import close_side_connections

        request_finished.connect(close_side_connections, dispatch_uid="pgqueue_side_connections")

        # Like admin.autodiscover(): import every installed app's jobs module so its
        # @job handlers are registered before the first enqueue or claim.
        autodiscover_modules("jobs")
