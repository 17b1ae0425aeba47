"""Pruning finished jobs: the function, the command, and workers applying RETENTION."""

import time
import uuid
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings
from django.utils import timezone

from django_pgqueue import pruning
from django_pgqueue.exceptions import SettingsError
from django_pgqueue.models import Job, JobDependency, JobEvent, JobWait
from django_pgqueue.pruning import _id_of_time, prune_jobs
from tests.workers import wait_for, worker_thread

pytestmark = pytest.mark.django_db


@pytest.fixture
def aged(make_job):
    """``aged(status, hours)``: a finished job whose completed_at is ``hours`` ago."""

    def make(status, hours):
        return make_job(status=status, completed_at=timezone.now() - timedelta(hours=hours))

    return make


def remaining():
    return sorted(Job.objects.values_list("status", flat=True))


def test_prune_deletes_old_completed_and_cancelled_jobs_only(aged, make_job):
    aged("completed", 48)
    aged("cancelled", 48)
    aged("failed", 48)
    aged("completed", 1)
    make_job(status="pending")
    make_job(status="running", worker_id="w")

    assert prune_jobs(24 * 3600) == 2

    assert remaining() == ["completed", "failed", "pending", "running"]


def test_prune_can_include_failed_jobs(aged):
    aged("failed", 48)
    aged("completed", 48)

    assert prune_jobs(3600, statuses=["failed"]) == 1
    assert remaining() == ["completed"]


def test_prune_works_in_bounded_batches(aged):
    for _ in range(5):
        aged("completed", 48)

    assert prune_jobs(3600, batch_size=2, max_batches=1) == 2
    assert prune_jobs(3600, batch_size=2) == 3
    assert remaining() == []


def test_prune_dry_run_counts_without_deleting(aged):
    aged("completed", 48)
    aged("completed", 48)

    assert prune_jobs(3600, dry_run=True) == 2
    assert Job.objects.count() == 2


def test_pruned_jobs_take_their_progress_events_with_them(aged):
    job = aged("completed", 48)
    JobEvent.objects.create(job=job, progress=50, stage="half")

    prune_jobs(3600)

    assert not JobEvent.objects.exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"older_than": 0}, "older_than must be a positive"),
        ({"older_than": float("nan")}, "older_than must be a positive"),
        ({"older_than": 60, "statuses": ["running"]}, "statuses must be among"),
        ({"older_than": 60, "batch_size": 0}, "batch_size must be at least 1"),
    ],
)
def test_prune_rejects_invalid_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        prune_jobs(**kwargs)


def test_prune_command_deletes_and_reports(aged):
    aged("completed", 24 * 8)
    aged("failed", 24 * 8)
    aged("completed", 1)
    out = StringIO()

    call_command("pgqueue_prune", "--older-than", "7d", stdout=out)

    assert out.getvalue().strip() == "deleted 1 finished job(s) (completed, cancelled)"
    assert remaining() == ["completed", "failed"]


def test_prune_command_include_failed_and_dry_run(aged):
    aged("failed", 3)
    out = StringIO()

    call_command("pgqueue_prune", "--older-than", "2h", "--include-failed", "--dry-run", stdout=out)

    assert "would delete 1 finished job(s) (completed, cancelled, failed)" in out.getvalue()
    assert remaining() == ["failed"]


@pytest.mark.parametrize("value", ["soon", "7x", "-1d", "0"])
def test_prune_command_rejects_a_bad_duration(value):
    with pytest.raises(CommandError):
        call_command("pgqueue_prune", "--older-than", value)


@pytest.mark.django_db(transaction=True)
def test_workers_apply_the_retention_settings(aged):
    old_done = aged("completed", 2)
    old_failed = aged("failed", 2)
    with (
        override_settings(PGQUEUE={"RETENTION": 3600, "HEARTBEAT_INTERVAL": 0.1, "STALE_AFTER": 3}),
        worker_thread(concurrency=1, poll_interval=0.1),
    ):
        wait_for(lambda: not Job.objects.filter(pk=old_done.pk).exists(), timeout=10)
    assert Job.objects.filter(pk=old_failed.pk).exists()  # FAILED_RETENTION is unset


@pytest.mark.parametrize("value", [0, -1, "1d"])
def test_retention_must_be_a_positive_duration_or_none(value):
    from django_pgqueue import conf

    with override_settings(PGQUEUE={"RETENTION": value}), pytest.raises(SettingsError):
        conf.get_settings()
    with override_settings(PGQUEUE={"RETENTION": None, "FAILED_RETENTION": timedelta(days=30)}):
        assert conf.get_settings().FAILED_RETENTION == 30 * 86400


class TestWorkflows:
    """A workflow's jobs go together, once every one of them is finished and old."""

    @pytest.fixture(autouse=True)
    def _from_the_oldest(self):
        # Each test starts its passes over workflows from the oldest.
        pruning._resume_after.clear()
        yield
        pruning._resume_after.clear()

    @pytest.fixture
    def step(self, make_job):
        """``step(workflow, status, hours)``: a job of ``workflow`` finished ``hours``
        ago (or not finished, for waiting, pending and running)."""

        def make(workflow, status, hours=48):
            finished = status in ("completed", "failed", "cancelled")
            completed_at = timezone.now() - timedelta(hours=hours) if finished else None
            return make_job(workflow_id=workflow, status=status, completed_at=completed_at)

        return make

    def workflow(self, days_ago=3, n=0):
        """A workflow id made ``days_ago`` days ago, as enqueue makes one then."""
        created = time.time() - days_ago * 86400
        return uuid.UUID(int=_id_of_time(created).int + n + 1)

    def test_a_workflow_with_a_job_not_finished_is_kept(self, step):
        workflow = self.workflow()
        step(workflow, "completed")
        step(workflow, "waiting")

        assert prune_jobs(3600) == 0
        assert Job.objects.filter(workflow_id=workflow).count() == 2

    def test_a_finished_workflow_past_retention_goes_whole(self, step):
        workflow = self.workflow()
        first, second = step(workflow, "completed"), step(workflow, "cancelled")
        JobDependency.objects.create(job=second, dependency=first, on_failure="cancel")
        JobWait.objects.create(job=second, unresolved=1, cancelled_by=first)
        plain = step(None, "completed")

        assert prune_jobs(3600) == 3

        assert not Job.objects.filter(pk__in=[first.pk, second.pk, plain.pk]).exists()
        assert not JobDependency.objects.exists() and not JobWait.objects.exists()

    def test_a_workflow_waits_for_its_last_job_to_be_past_retention(self, step):
        workflow = self.workflow()
        step(workflow, "completed", hours=48)
        step(workflow, "completed", hours=0.5)

        assert prune_jobs(3600) == 0
        assert prune_jobs(1200) == 2

    def test_a_workflow_with_a_failed_job_goes_with_the_failed_jobs(self, step):
        workflow = self.workflow()
        step(workflow, "completed")
        step(workflow, "failed")

        assert prune_jobs(3600) == 0
        assert prune_jobs(3600, statuses=["failed"]) == 2

    def test_a_dry_run_counts_the_jobs_of_whole_workflows(self, step):
        kept, pruned = self.workflow(n=0), self.workflow(n=1)
        step(kept, "completed")
        step(kept, "running")
        step(pruned, "completed")
        step(pruned, "cancelled")

        assert prune_jobs(3600, dry_run=True) == 2
        assert Job.objects.count() == 4

    def test_workflows_kept_long_do_not_hide_newer_ones(self, step):
        for n in range(3):
            step(self.workflow(days_ago=5, n=n), "failed")
        prunable = self.workflow(days_ago=4)
        step(prunable, "completed")

        deleted = sum(prune_jobs(3600, batch_size=2) for _ in range(3))

        assert deleted == 1
        assert not Job.objects.filter(workflow_id=prunable).exists()
        assert Job.objects.filter(status="failed").count() == 3
