from django.urls import path

from . import views

app_name = "shop"

urlpatterns = [
    path("", views.home, name="home"),
    path("signup/", views.sign_up, name="sign_up"),
    path("photos/", views.upload_photo, name="upload_photo"),
]
