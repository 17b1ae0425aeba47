"""``django_pgqueue.routers.JobsRouter``: the app's models, and only they, are routed to
``PGQUEUE["DATABASE"]``, for reads, writes, relations and migrations."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.contrib.auth.models import User
from django.db import router

from django_pgqueue import enqueue
from django_pgqueue.models import Job, JobEvent
from django_pgqueue.routers import JobsRouter

APP_MODELS = list(apps.get_app_config("django_pgqueue").get_models())


@pytest.fixture
def jobs_router(pgqueue_settings, settings):
    pgqueue_settings(DATABASE="jobs")
    settings.DATABASE_ROUTERS = ["django_pgqueue.routers.JobsRouter"]


@pytest.mark.usefixtures("jobs_router")
@pytest.mark.parametrize("model", APP_MODELS, ids=lambda model: model.__name__)
def test_reads_and_writes_of_the_app_models_go_to_the_jobs_database(model):
    assert router.db_for_read(model) == "jobs"
    assert router.db_for_write(model) == "jobs"


@pytest.mark.usefixtures("jobs_router")
def test_other_models_are_left_to_the_next_router():
    assert JobsRouter().db_for_read(User) is None
    assert JobsRouter().db_for_write(User) is None
    assert router.db_for_write(User) == "default"


@pytest.mark.usefixtures("jobs_router")
def test_the_app_migrates_only_in_the_jobs_database():
    assert router.allow_migrate_model("jobs", Job)
    assert not router.allow_migrate_model("default", Job)
    assert not router.allow_migrate("default", "django_pgqueue", model_name="jobevent")
    assert JobsRouter().allow_migrate("default", "auth") is None


@pytest.mark.usefixtures("jobs_router")
def test_relations_between_the_app_models_are_allowed():
    job, event, user = Job(), JobEvent(), User()

    assert JobsRouter().allow_relation(job, event) is True
    assert JobsRouter().allow_relation(job, user) is None


def test_the_router_follows_the_setting(pgqueue_settings):
    assert JobsRouter().db_for_write(Job) == "default"
    pgqueue_settings(DATABASE="jobs")
    assert JobsRouter().db_for_write(Job) == "jobs"


@pytest.mark.django_db(databases=["default", "jobs"])
@pytest.mark.usefixtures("jobs_router")
def test_jobs_are_cancelled_where_they_were_enqueued():
    job = enqueue("tests.noop")

    assert job.cancel() is True
    assert Job.objects.using("jobs").get(pk=job.pk).status == "cancelled"
    assert not Job.objects.using("default").exists()
