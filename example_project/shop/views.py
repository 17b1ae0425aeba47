"""The shop's pages: sign up, upload a photo, and watch the jobs they enqueue."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from django_pgqueue import Job

from . import services
from .forms import PhotoForm, SignUpForm
from .models import Customer, ProductPhoto

RECENT = 20


def _page(request: HttpRequest, status: int = 200, **forms: Any) -> HttpResponse:
    jobs = list(Job.objects.order_by("-created_at")[:RECENT])
    now = timezone.now()
    context = {
        "signup_form": forms.get("signup_form") or SignUpForm(),
        "photo_form": forms.get("photo_form") or PhotoForm(),
        "jobs": jobs,
        "customers": Customer.objects.all()[:RECENT],
        "photos": ProductPhoto.objects.all()[:RECENT],
        # Refresh the page while some due job is still waiting or running.
        "refresh": any(not job.is_finished and job.run_at <= now for job in jobs),
    }
    return render(request, "shop/home.html", context, status=status)


@require_GET
def home(request: HttpRequest) -> HttpResponse:
    return _page(request)


@require_POST
def sign_up(request: HttpRequest) -> HttpResponse:
    form = SignUpForm(request.POST)
    if not form.is_valid():
        return _page(request, status=400, signup_form=form)
    customer, jobs = services.sign_up(form.cleaned_data["email"], form.cleaned_data["name"])
    messages.success(request, f"Welcome, {customer.email}! {len(jobs)} jobs enqueued.")
    return redirect("shop:home")


@require_POST
def upload_photo(request: HttpRequest) -> HttpResponse:
    form = PhotoForm(request.POST, request.FILES)
    if not form.is_valid():
        return _page(request, status=400, photo_form=form)
    photo, job = services.add_photo(form.cleaned_data["title"], form.cleaned_data["image"])
    messages.success(request, f"Photo {photo.title!r} saved; thumbnail job {job.id} enqueued.")
    return redirect("shop:home")
