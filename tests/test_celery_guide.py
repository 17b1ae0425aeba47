"""The worked example of the guide from Celery (docs/how-to/from-celery.md) does what the
guide says: tests/celery_guide/, the shop converted from Celery, run with the test kit."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

import pytest
from django.core import mail
from django.db import transaction

from django_pgqueue import registry
from django_pgqueue.models import Job, JobStatus
from django_pgqueue.periodic import declared_schedules
from django_pgqueue.rates import Rate
from django_pgqueue.testing import immediate, refute_enqueued, run_job

JOB_TYPES = ("shop.send_receipt", "shop.charge", "shop.export_report")


@pytest.fixture
def shop() -> Iterator[Any]:
    """The guide's shop, its job types registered for the test only (a schedule left
    registered would be every other test's too)."""
    jobs = importlib.import_module("tests.celery_guide.jobs")
    for definition in (jobs.send_receipt, jobs.charge, jobs.export_report):
        if definition.job_type not in registry.registered_job_types():
            registry.register(definition)
    yield importlib.import_module("tests.celery_guide.shop")
    for job_type in JOB_TYPES:
        registry.unregister(job_type)


@pytest.mark.django_db(transaction=True)
def test_an_order_charges_then_sends_the_receipt_once_committed(shop):
    with immediate() as runs:
        shop.place_order(7, "ada@example.com", 1999)

    assert [run.job.job_type for run in runs] == ["shop.charge", "shop.send_receipt"]
    assert runs[0].result == "ch_7_1999"
    assert [message.to for message in mail.outbox] == [["ada@example.com"]]
    assert {job.queue for job in Job.objects.all()} == {"checkout"}
    assert {job.priority for job in Job.objects.all()} == {5}


@pytest.mark.django_db(transaction=True)
def test_an_order_rolled_back_leaves_no_job(shop):
    with immediate(), pytest.raises(RuntimeError), transaction.atomic():
        shop.place_order(8, "bob@example.com", 500)
        raise RuntimeError("the order's own write failed")

    refute_enqueued()
    assert mail.outbox == []


@pytest.mark.django_db
def test_a_busy_gateway_retries_the_charge_after_30_seconds(shop, monkeypatch):
    from tests.celery_guide import payments

    def busy(order_id: int, amount_cents: int) -> str:
        raise payments.GatewayBusy

    monkeypatch.setattr(payments, "charge_card", busy)

    run = run_job("shop.charge", {"order_id": 9, "amount_cents": 100})

    assert (run.status, run.retry_in) == (JobStatus.PENDING, 30)
    assert run.error == "RetryJob: the gateway is busy"
    last = run_job("shop.charge", {"order_id": 9, "amount_cents": 100}, attempt=4)
    assert last.status == JobStatus.FAILED  # max_retries=3: four attempts in all


@pytest.mark.django_db
def test_a_receipt_that_cannot_be_sent_is_retried_with_a_backoff(shop, monkeypatch):
    from smtplib import SMTPException

    def down(*args: Any, **kwargs: Any) -> int:
        raise SMTPException("mail server down")

    monkeypatch.setattr("tests.celery_guide.jobs.send_mail", down)

    run = run_job("shop.send_receipt", {"order_id": 1, "email": "ada@example.com"})

    assert run.status == JobStatus.PENDING and run.retry_in is not None
    assert 0 < run.retry_in <= 1  # Backoff(base=1): the first retry within a second
    assert run_job("shop.send_receipt", {"order_id": 1, "email": "a@b.c"}, attempt=6).status == (
        JobStatus.FAILED
    )


def test_the_report_keeps_its_rate_timeout_queue_and_schedule(shop):
    definition = registry.get_definition("shop.export_report")

    assert (definition.rate_limit, definition.timeout, definition.queue) == (
        Rate(10, 60),
        60,
        "reports",
    )
    (schedule,) = [s for s in declared_schedules() if s.job_type == "shop.export_report"]
    assert schedule.cron == "0 3 * * *"
