from django.contrib import admin
from django.utils.html import format_html

from .models import Album, Customer, Order, ProductPhoto


@admin.register(Customer)
class CustomerAdmin(admin.ModelAdmin):
    list_display = ("email", "name", "created_at", "welcomed_at", "followed_up_at", "crm_synced_at")
    search_fields = ("email", "name")
    readonly_fields = ("created_at",)


@admin.register(ProductPhoto)
class ProductPhotoAdmin(admin.ModelAdmin):
    list_display = ("title", "preview", "thumbnail_status", "created_at")
    list_filter = ("thumbnail_status",)
    readonly_fields = ("created_at",)

    @admin.display(description="Thumbnail")
    def preview(self, photo: ProductPhoto) -> str:
        if not photo.thumbnail:
            return "-"
        return format_html('<img src="{}" width="32" height="32" alt="">', photo.thumbnail.url)


@admin.register(Album)
class AlbumAdmin(admin.ModelAdmin):
    list_display = ("title", "cover_image", "created_at")
    readonly_fields = ("created_at",)

    @admin.display(description="Cover")
    def cover_image(self, album: Album) -> str:
        if not album.cover:
            return "-"
        return format_html('<img src="{}" width="32" height="32" alt="">', album.cover.url)


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ("__str__", "customer", "total_cents", "charges", "receipt_sent_at")
    readonly_fields = ("created_at",)
