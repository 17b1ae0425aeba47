"""Make sure a superuser exists, so that ``make serve`` opens an admin you can log into."""

from __future__ import annotations

import os
import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = (
        "Create a superuser from DJANGO_SUPERUSER_USERNAME (default: admin), "
        "DJANGO_SUPERUSER_EMAIL and DJANGO_SUPERUSER_PASSWORD (default: a random one, "
        "printed). An existing user is left unchanged unless DJANGO_SUPERUSER_PASSWORD is set."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        user_model = get_user_model()
        username = os.environ.get("DJANGO_SUPERUSER_USERNAME") or "admin"
        email = os.environ.get("DJANGO_SUPERUSER_EMAIL") or f"{username}@example.com"
        password = os.environ.get("DJANGO_SUPERUSER_PASSWORD")
        user = user_model._default_manager.filter(**{user_model.USERNAME_FIELD: username}).first()
        if user is not None and not password:
            self.stdout.write(f"Superuser {username!r} exists; its password is unchanged.")
            return
        shown = password is None
        password = password or secrets.token_urlsafe(12)
        if user is None:
            user_model._default_manager.create_superuser(username, email, password)
            action = "Created"
        else:
            user.set_password(password)
            user.save(update_fields=["password"])
            action = "Updated"
        secret = password if shown else "from DJANGO_SUPERUSER_PASSWORD"
        self.stdout.write(
            self.style.SUCCESS(f"{action} superuser {username!r}, password: {secret}")
        )
