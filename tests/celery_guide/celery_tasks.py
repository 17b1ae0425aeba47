"""The guide's shop as it was on Celery (docs/how-to/from-celery.md): the starting point.

Kept beside its conversion (jobs.py, shop.py) to show what changed; Celery is not
installed here, so this module is never imported.
"""

from smtplib import SMTPException

from celery import chain, shared_task
from celery.schedules import crontab
from django.core.mail import send_mail
from django.db import transaction

from . import payments


@shared_task(autoretry_for=(SMTPException,), retry_backoff=True, max_retries=5)
def send_receipt(order_id, email):
    send_mail(f"Receipt for order {order_id}", "Thank you!", None, [email])


@shared_task(bind=True, max_retries=3)
def charge(self, order_id, amount_cents):
    try:
        return payments.charge_card(order_id, amount_cents)
    except payments.GatewayBusy as exc:
        raise self.retry(exc=exc, countdown=30) from exc


@shared_task(rate_limit="10/m", time_limit=60)
def export_report(day):
    return {"day": day, "rows": 0}


def place_order(order_id, email, amount_cents):
    """What the checkout view does once the order is saved."""
    with transaction.atomic():
        # ... the order's rows are written here ...
        steps = chain(charge.si(order_id, amount_cents), send_receipt.si(order_id, email))
        transaction.on_commit(lambda: steps.apply_async(queue="checkout", priority=5))


# settings.py
CELERY_BEAT_SCHEDULE = {
    "nightly-report": {
        "task": "shop.tasks.export_report",
        "schedule": crontab(hour=3, minute=0),
        "args": ("yesterday",),
        "options": {"queue": "reports"},
    },
}
