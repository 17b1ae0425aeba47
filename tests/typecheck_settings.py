"""Settings for mypy's Django plugin (``make typecheck``): the installed apps whose
models the package refers to, and nothing else. The test suite's settings need a
``DATABASE_URL`` and django-environ, which has no types."""

SECRET_KEY = "typecheck-only-not-secret"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_pgqueue",
]
