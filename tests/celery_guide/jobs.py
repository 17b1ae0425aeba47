"""The guide's shop on django-pgqueue (docs/how-to/from-celery.md): its Celery tasks,
converted. Tested by tests/test_celery_guide.py."""

from __future__ import annotations

from typing import Any

from django.core.mail import send_mail

from django_pgqueue import Backoff, Job, RetryJob, job

from . import payments


# autoretry_for + retry_backoff + max_retries=5: every exception retries, with an
# exponential backoff, for 1 + 5 attempts.
@job("shop.send_receipt", max_attempts=6, retry_backoff=Backoff(base=1, max=600))
def send_receipt(job: Job) -> None:
    order_id = job.data["order_id"]
    send_mail(f"Receipt for order {order_id}", "Thank you!", None, [job.data["email"]])


# bind=True + self.retry(countdown=30): raise RetryJob with the delay.
@job("shop.charge", max_attempts=4)
def charge(job: Job) -> str:
    try:
        return payments.charge_card(job.data["order_id"], job.data["amount_cents"])
    except payments.GatewayBusy as exc:
        raise RetryJob("the gateway is busy", delay=30) from exc


# rate_limit, time_limit and the beat entry: options of the job type. The rate holds
# across all workers, and the schedule needs no beat process.
@job(
    "shop.export_report",
    queue="reports",
    rate_limit="10/m",
    timeout=60,
    schedule="0 3 * * *",
)
def export_report(job: Job) -> dict[str, Any]:
    return {"day": job.data.get("day", "yesterday"), "rows": 0}
