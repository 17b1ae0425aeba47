"""The shop's business rows. Jobs refer to them by id: payloads carry references."""

from django.db import models


class Customer(models.Model):
    """Someone who signed up; the welcome email is sent by a job."""

    email = models.EmailField(unique=True)
    name = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    welcomed_at = models.DateTimeField(null=True, blank=True)
    followed_up_at = models.DateTimeField(null=True, blank=True)
    crm_synced_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("-created_at",)

    def __str__(self) -> str:
        return self.email


class ThumbnailStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    READY = "ready", "Ready"
    FAILED = "failed", "Failed"


class Album(models.Model):
    """Photos shown together; its cover is built by a job once every thumbnail is made."""

    title = models.CharField(max_length=200)
    cover = models.FileField(upload_to="covers/", blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("-created_at",)

    def __str__(self) -> str:
        return self.title


class ProductPhoto(models.Model):
    """An uploaded product photo; its thumbnail is made by a job."""

    title = models.CharField(max_length=200)
    album = models.ForeignKey(
        Album, null=True, blank=True, on_delete=models.SET_NULL, related_name="photos"
    )
    image = models.FileField(upload_to="photos/")
    thumbnail = models.FileField(upload_to="thumbnails/", blank=True)
    thumbnail_status = models.CharField(
        max_length=16, choices=ThumbnailStatus.choices, default=ThumbnailStatus.PENDING
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("-created_at",)

    def __str__(self) -> str:
        return self.title


class Order(models.Model):
    """An order; its checkout (charge, receipt, CRM) is one job of durable steps."""

    customer = models.ForeignKey(Customer, on_delete=models.CASCADE, related_name="orders")
    total_cents = models.PositiveIntegerField()
    #: How many times the (stand-in) payment provider charged it: 1, however many
    #: attempts the checkout took.
    charges = models.PositiveIntegerField(default=0)
    charge_id = models.CharField(max_length=50, blank=True)
    receipt_sent_at = models.DateTimeField(null=True, blank=True)
    crm_recorded_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("-created_at",)

    def __str__(self) -> str:
        return f"order #{self.pk}"
