"""The shop's write operations. Each one writes its rows and enqueues its jobs in one
transaction: both happen, or neither does.

Views, management commands and the demo all go through these functions.
"""

from __future__ import annotations

from datetime import timedelta

from django.core.files import File
from django.db import transaction

import django_pgqueue

from .jobs import (
    build_album_cover,
    checkout,
    make_thumbnail,
    send_follow_up_email,
    send_welcome_email,
)
from .models import Album, Customer, Order, ProductPhoto

FOLLOW_UP_DELAY = timedelta(days=1)


def sign_up(email: str, name: str = "") -> tuple[Customer, list[django_pgqueue.Job]]:
    """Create a customer and enqueue their welcome email and, a day later, the follow-up.

    Returns the customer and the jobs. Called inside an outer ``transaction.atomic``
    that rolls back, neither the customer nor the jobs remain.
    """
    with transaction.atomic():
        customer = Customer.objects.create(email=email, name=name)
        jobs = django_pgqueue.enqueue_many(
            [
                {"job_type": send_welcome_email.job_type, "data": {"customer_id": customer.pk}},
                {
                    "job_type": send_follow_up_email.job_type,
                    "data": {"customer_id": customer.pk},
                    "delay": FOLLOW_UP_DELAY,
                },
            ]
        )
    return customer, jobs


def add_photo(title: str, image: File) -> tuple[ProductPhoto, django_pgqueue.Job]:
    """Store an uploaded photo and enqueue the job that makes its thumbnail."""
    photo = ProductPhoto(title=title, image=image)
    stored = ""
    try:
        with transaction.atomic():
            photo.save()  # writes the file to storage at once; the row waits for the commit
            stored = photo.image.name
            job = make_thumbnail.enqueue({"photo_id": photo.pk})
    except BaseException:
        # Files are not transactional: remove the one a rolled-back upload left behind.
        if stored:
            photo.image.storage.delete(stored)
        raise
    return photo, job


def add_album(title: str, images: list[File]) -> tuple[Album, django_pgqueue.Workflow]:
    """Store an album and its photos, and enqueue their workflow: a thumbnail job per
    photo, side by side, then the album's cover once every one of them has finished.

    One transaction: the album, its photos and the whole workflow exist together or not
    at all. ``on_dependency_failure="run"``: a photo whose thumbnail fails does not keep
    the cover from being built from the others.
    """
    stored: list[str] = []
    try:
        with transaction.atomic():
            album = Album.objects.create(title=title)
            photos = []
            for image in images:
                photo = ProductPhoto(title=f"{title}: {image.name}", image=image, album=album)
                photo.save()
                stored.append(photo.image.name)
                photos.append(photo)
            workflow = django_pgqueue.chord(
                [make_thumbnail.step({"photo_id": photo.pk}) for photo in photos],
                build_album_cover.step({"album_id": album.pk}),
            ).enqueue(on_dependency_failure="run")
    except BaseException:
        for name in stored:
            ProductPhoto.image.field.storage.delete(name)
        raise
    return album, workflow


def place_order(
    customer: Customer, total_cents: int, *, simulated_outage: int = 0
) -> tuple[Order, django_pgqueue.Job]:
    """Create an order and enqueue its checkout (``simulated_outage``: how many of the
    checkout's first attempts find the CRM down)."""
    with transaction.atomic():
        order = Order.objects.create(customer=customer, total_cents=total_cents)
        data: dict[str, int] = {"order_id": order.pk}
        if simulated_outage:
            data["simulated_outage"] = simulated_outage
        job = checkout.enqueue(data)
    return order, job
