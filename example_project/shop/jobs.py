"""Background jobs of the shop. django-pgqueue imports this module at start-up.

Jobs run at least once: each handler checks whether its work is already done, so a
job that runs twice (a worker killed after the work but before the bookkeeping)
does no harm. The checkout goes further: its steps are durable (``job.step()``), so a
retry never charges or emails twice.
"""

from __future__ import annotations

import hashlib
from typing import Any

from django.conf import settings
from django.core.files.base import ContentFile
from django.core.mail import send_mail
from django.utils import timezone

import django_pgqueue
from django_pgqueue import Backoff, FailJob

from . import crm, payments
from .models import Album, Customer, Order, ProductPhoto, ThumbnailStatus
from .preview import identicon_png

#: Priorities from the original design: 150 user-requested, 100 system, 30 backfill.
USER_REQUESTED = 150
BACKFILL = 30


def _customer(job: django_pgqueue.Job) -> Customer:
    try:
        return Customer.objects.get(pk=job.data["customer_id"])
    except Customer.DoesNotExist:
        raise FailJob(f"customer {job.data['customer_id']} no longer exists") from None


@django_pgqueue.job("shop.send_welcome_email", priority=USER_REQUESTED)
def send_welcome_email(job: django_pgqueue.Job) -> dict[str, Any]:
    """Send the welcome email of a new customer (``data``: ``customer_id``)."""
    customer = _customer(job)
    if customer.welcomed_at is not None:
        return {"skipped": "already welcomed"}
    send_mail(
        subject="Welcome to the Example Shop",
        message=f"Hello {customer.name or customer.email},\n\nthanks for signing up!\n",
        from_email=settings.DEFAULT_FROM_EMAIL,
        recipient_list=[customer.email],
    )
    # The handler runs in a transaction (atomic=True): this write commits with the job.
    customer.welcomed_at = timezone.now()
    customer.save(update_fields=["welcomed_at"])
    return {"sent_to": customer.email}


@django_pgqueue.job("shop.send_follow_up_email")
def send_follow_up_email(job: django_pgqueue.Job) -> dict[str, Any]:
    """Send tips a day after sign-up; enqueued with a delay (``data``: ``customer_id``)."""
    customer = _customer(job)
    if customer.followed_up_at is not None:
        return {"skipped": "already followed up"}
    send_mail(
        subject="Three tips for your first order",
        message="1. Save a wish list.\n2. Follow a maker.\n3. Check out in one click.\n",
        from_email=settings.DEFAULT_FROM_EMAIL,
        recipient_list=[customer.email],
    )
    customer.followed_up_at = timezone.now()
    customer.save(update_fields=["followed_up_at"])
    return {"sent_to": customer.email}


# A 503 from the CRM is worth retrying: after about 1 s, then 2 s, ... capped at 60 s.
# The short base keeps the demo quick; against a real CRM start at a minute.
@django_pgqueue.job(
    "shop.sync_to_crm", priority=BACKFILL, max_attempts=3, retry_backoff=Backoff(base=1, max=60)
)
def sync_to_crm(job: django_pgqueue.Job) -> dict[str, Any]:
    """Push a customer to the CRM (``data``: ``customer_id``, optional ``simulated_outage``)."""
    customer = _customer(job)
    job.set_progress(50, "calling the CRM")
    contact_id = crm.push_contact(
        customer.email,
        customer.name,
        attempt=job.attempts,
        simulated_outage=job.data.get("simulated_outage", 0),
    )
    customer.crm_synced_at = timezone.now()
    customer.save(update_fields=["crm_synced_at"])
    return {"contact_id": contact_id}


# atomic=False: files are not transactional, and a failed attempt must be able to
# record the failure on the photo before it gives up.
@django_pgqueue.job("shop.make_thumbnail", priority=USER_REQUESTED, atomic=False)
def make_thumbnail(job: django_pgqueue.Job) -> dict[str, Any]:
    """Make the 64x64 preview of an uploaded photo (``data``: ``photo_id``)."""
    photo = ProductPhoto.objects.filter(pk=job.data["photo_id"]).first()
    if photo is None:
        raise FailJob(f"photo {job.data['photo_id']} no longer exists")
    if photo.thumbnail_status == ThumbnailStatus.READY:
        return {"skipped": "thumbnail already made", "thumbnail": photo.thumbnail.name}

    job.set_progress(10, "opening the upload")
    try:
        upload = photo.image.open("rb")
    except FileNotFoundError:
        ProductPhoto.objects.filter(pk=photo.pk).update(thumbnail_status=ThumbnailStatus.FAILED)
        # Retrying cannot bring the file back: fail at once, without further attempts.
        raise FailJob(f"the upload {photo.image.name!r} is missing; upload it again") from None

    size = photo.image.size or 1
    digest = hashlib.sha256()
    done = reported = 0
    with upload:
        for chunk in upload.chunks(chunk_size=64 * 1024):
            digest.update(chunk)
            done += len(chunk)
            percent = 10 + 50 * min(done, size) // size
            if percent - reported >= 10:  # a progress write per 10%, not per chunk
                job.set_progress(percent, "reading the upload")
                reported = percent

    job.set_progress(70, "rendering the preview")
    png = identicon_png(digest.digest())

    job.set_progress(90, "saving the thumbnail")
    photo.thumbnail.save(f"photo-{photo.pk}.png", ContentFile(png), save=False)
    photo.thumbnail_status = ThumbnailStatus.READY
    photo.save(update_fields=["thumbnail", "thumbnail_status"])
    return {"thumbnail": photo.thumbnail.name, "bytes": len(png)}


@django_pgqueue.job("shop.build_album_cover", priority=USER_REQUESTED)
def build_album_cover(job: django_pgqueue.Job) -> dict[str, Any]:
    """Build an album's cover from the thumbnails of its photos (``data``: ``album_id``).

    The last step of an album's workflow (``services.add_album``): it runs once every
    thumbnail job finished, and reads their results in the order of the photos. A photo
    whose thumbnail failed gives ``None`` and is left out.
    """
    album = Album.objects.filter(pk=job.data["album_id"]).first()
    if album is None:
        raise FailJob(f"album {job.data['album_id']} no longer exists")
    thumbnails = [
        result["thumbnail"]
        for result in job.dependency_results().values()
        if result and "thumbnail" in result
    ]
    if not thumbnails:
        raise FailJob(f"no photo of album {album.pk} has a thumbnail")
    digest = hashlib.sha256("\n".join(thumbnails).encode()).digest()
    album.cover.save(f"album-{album.pk}.png", ContentFile(identicon_png(digest)), save=True)
    return {"cover": album.cover.name, "thumbnails": len(thumbnails)}


#: How long the checkout waits for the charge to settle before it records the sale;
#: a real provider's is days (``timedelta(days=2)``), the demo's a second.
SETTLEMENT = 1.0


def _send_receipt(order_id: int, charge_id: str) -> None:
    order = Order.objects.select_related("customer").get(pk=order_id)
    send_mail(
        subject=f"Your receipt for order #{order.pk}",
        message=f"We charged {order.total_cents / 100:.2f} ({charge_id}). Thank you!\n",
        from_email=settings.DEFAULT_FROM_EMAIL,
        recipient_list=[order.customer.email],
    )
    Order.objects.filter(pk=order_id).update(receipt_sent_at=timezone.now())


def _record_charge(order_id: int, charge_id: str) -> None:
    Order.objects.filter(pk=order_id).update(charge_id=charge_id)


# atomic=False: each step commits on its own (the charge and the email cannot be rolled
# back anyway), so that what a failed attempt did is kept and not done again.
@django_pgqueue.job(
    "shop.checkout", max_attempts=3, retry_backoff=Backoff(base=1, max=60), atomic=False
)
def checkout(job: django_pgqueue.Job) -> dict[str, Any]:
    """Charge an order, send its receipt, wait for the charge to settle and record the
    sale in the CRM (``data``: ``order_id``, optional ``simulated_outage``): durable
    steps, so a retry after the CRM's outage neither charges nor emails again."""
    order = Order.objects.select_related("customer").get(pk=job.data["order_id"])
    charge = job.step("charge", payments.charge, order.pk, order.total_cents)
    # Atomic: the write and its checkpoint commit together, exactly once.
    job.step("record-charge", _record_charge, order.pk, charge["id"], atomic=True)
    job.step("receipt", _send_receipt, order.pk, charge["id"])
    # The job gives its slot back while it waits, and comes back when it has settled.
    job.sleep("settlement", SETTLEMENT)
    sale = job.step(
        "crm",
        crm.record_sale,
        order.customer.email,
        order.total_cents,
        attempt=job.attempts,
        simulated_outage=job.data.get("simulated_outage", 0),
    )
    Order.objects.filter(pk=order.pk).update(crm_recorded_at=timezone.now())
    return {"charge": charge["id"], "sale": sale}
