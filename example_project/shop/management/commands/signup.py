"""Sign customers up from the command line, each in its own transaction."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import IntegrityError

from shop.services import sign_up


class Command(BaseCommand):
    help = (
        "Sign customers up: each sign-up creates the customer and enqueues the welcome "
        "and follow-up emails in one transaction. "
        "Examples: `signup alice@example.com bob@example.com`, `signup --count 20`."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("emails", nargs="*", metavar="EMAIL")
        parser.add_argument(
            "--count",
            type=int,
            default=0,
            help="Also sign up this many generated customers, customerN@example.com (default: 0).",
        )
        parser.add_argument("--name", default="", help="Name of every customer (default: none).")

    def handle(self, *args: Any, **options: Any) -> None:
        emails: list[str] = list(options["emails"])
        if options["count"] < 0:
            raise CommandError("--count must not be negative")
        emails += _generated_emails(options["count"], taken=set(emails))
        if not emails:
            raise CommandError("give at least one EMAIL, or --count N")
        for email in emails:
            try:
                customer, jobs = sign_up(email, options["name"])
            except IntegrityError:
                raise CommandError(f"{email} has already signed up") from None
            job_list = ", ".join(f"{job.job_type} {job.id}" for job in jobs)
            self.stdout.write(f"signed up {customer.email} (customer {customer.pk}): {job_list}")


def _generated_emails(count: int, *, taken: set[str]) -> list[str]:
    from shop.models import Customer

    taken |= set(
        Customer.objects.filter(email__startswith="customer").values_list("email", flat=True)
    )
    emails: list[str] = []
    number = 1
    while len(emails) < count:
        email = f"customer{number}@example.com"
        if email not in taken:
            emails.append(email)
        number += 1
    return emails
