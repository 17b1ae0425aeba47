from django.apps import AppConfig


class BenchAppConfig(AppConfig):
    name = "bench.benchapp"
    label = "pgqueue_bench"
    verbose_name = "django-pgqueue benchmark jobs"
