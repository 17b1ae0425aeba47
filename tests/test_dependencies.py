"""Jobs that wait for other jobs (``depends_on``): written in the caller's transaction,
released in the transaction that completes their last dependency, cancelled (or run
anyway) when one fails, put back when it is retried."""

from __future__ import annotations

import threading
import uuid

import pytest
from django.db import transaction
from django.urls import reverse

from django_pgqueue import Dependency, InvalidJobError, Step, chord, enqueue, enqueue_many
from django_pgqueue.models import Job, JobDependency, JobStatus, JobWait
from django_pgqueue.worker import Worker
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db


def status(job: Job) -> str:
    return Job.objects.values_list("status", flat=True).get(pk=job.pk)


def finish(job: Job, state: str = JobStatus.COMPLETED) -> None:
    """Finish ``job`` as a worker's finish does: one UPDATE of its status."""
    Job.objects.filter(pk=job.pk).update(status=state)


def test_a_job_waits_for_the_job_it_depends_on():
    first = enqueue("tests.noop")
    second = enqueue("tests.noop", depends_on=[first])

    assert second.status == JobStatus.WAITING
    assert status(first) == JobStatus.PENDING
    assert second.workflow_id is not None
    assert Job.objects.get(pk=first.pk).workflow_id == second.workflow_id
    assert JobWait.objects.get(job=second).unresolved == 1
    edge = JobDependency.objects.get(job=second)
    assert (edge.dependency_id, edge.on_failure, edge.resolved) == (first.id, "cancel", False)
    assert JobDependency.objects.filter(dependency=first).count() == 1


def test_completing_the_dependency_releases_the_job_in_the_same_transaction():
    first = enqueue("tests.noop")
    second = enqueue("tests.noop", depends_on=first)

    with transaction.atomic():
        finish(first)
        assert status(second) == JobStatus.PENDING
        transaction.set_rollback(True)

    assert status(second) == JobStatus.WAITING
    assert JobWait.objects.filter(job=second).exists()


def test_a_released_job_is_due_from_its_release_and_loses_its_counter():
    first = enqueue("tests.noop")
    second = enqueue("tests.noop", depends_on=[first.id])

    finish(first)

    released = Job.objects.get(pk=second.pk)
    assert released.status == JobStatus.PENDING
    assert released.run_at >= second.run_at
    assert not JobWait.objects.filter(job=second).exists()
    assert JobDependency.objects.get(job=second).resolved


def test_a_job_with_many_dependencies_waits_for_the_last_one():
    members = enqueue_many([{"job_type": "tests.noop"} for _ in range(3)])
    callback = enqueue("tests.noop", depends_on=members)

    finish(members[0])
    finish(members[2])
    assert status(callback) == JobStatus.WAITING
    assert JobWait.objects.get(job=callback).unresolved == 1

    finish(members[1])
    assert status(callback) == JobStatus.PENDING


def test_a_dependency_that_completed_before_the_enqueue_is_resolved_at_once():
    first = enqueue("tests.noop")
    finish(first)

    second = enqueue("tests.noop", depends_on=[str(first.id)])

    assert second.status == JobStatus.PENDING
    assert JobDependency.objects.get(job=second).resolved
    assert not JobWait.objects.filter(job=second).exists()


def test_the_jobs_exist_only_if_the_enqueuing_transaction_commits():
    before = Job.objects.count()
    with pytest.raises(RuntimeError), transaction.atomic():
        first = enqueue("tests.noop")
        enqueue("tests.noop", depends_on=[first])
        raise RuntimeError("the business write failed")

    assert Job.objects.count() == before
    assert not JobDependency.objects.exists()
    assert not JobWait.objects.exists()


def test_enqueue_many_specs_depend_on_each_other_by_index():
    jobs = enqueue_many(
        [
            {"job_type": "tests.noop", "depends_on": [2]},
            {"job_type": "tests.noop"},
            {"job_type": "tests.noop", "depends_on": [1]},
        ]
    )

    assert [job.status for job in jobs] == [
        JobStatus.WAITING,
        JobStatus.PENDING,
        JobStatus.WAITING,
    ]
    assert len({job.workflow_id for job in jobs}) == 1
    finish(jobs[1])
    assert [status(job) for job in jobs] == [
        JobStatus.WAITING,
        JobStatus.COMPLETED,
        JobStatus.PENDING,
    ]
    finish(jobs[2])
    assert status(jobs[0]) == JobStatus.PENDING


def test_a_failed_dependency_cancels_what_depends_on_it_transitively():
    first = enqueue("tests.noop")
    second = enqueue("tests.noop", depends_on=[first])
    third = enqueue("tests.noop", depends_on=[second])

    finish(first, JobStatus.FAILED)

    cancelled = {job.pk: job for job in Job.objects.filter(pk__in=[second.pk, third.pk])}
    assert {job.status for job in cancelled.values()} == {JobStatus.CANCELLED}
    assert cancelled[second.pk].last_error == (
        f"Cancelled: job {first.id}, which it depends on, is failed."
    )
    assert cancelled[third.pk].last_error == (
        f"Cancelled: job {second.id}, which it depends on, was cancelled because job "
        f"{first.id} is failed."
    )
    assert cancelled[third.pk].completed_at is not None
    assert JobWait.objects.get(job=second).cancelled_by_id == first.id
    assert JobWait.objects.get(job=third).cancelled_by_id == second.id


def test_under_run_anyway_a_failed_dependency_counts_as_finished():
    first, other = enqueue("tests.noop"), enqueue("tests.noop")
    second = enqueue("tests.noop", depends_on=[first, other], on_dependency_failure="run")

    finish(first, JobStatus.FAILED)
    assert status(second) == JobStatus.WAITING
    finish(other, JobStatus.CANCELLED)
    assert status(second) == JobStatus.PENDING


def test_retrying_a_failed_dependency_under_run_anyway_waits_for_it_again():
    flaky, other = enqueue("tests.noop"), enqueue("tests.noop")
    job = enqueue("tests.noop", depends_on=[flaky, other], on_dependency_failure="run")
    finish(flaky, JobStatus.FAILED)
    assert JobWait.objects.get(job=job).unresolved == 1

    Job.objects.filter(pk=flaky.pk).retry()

    assert JobWait.objects.get(job=job).unresolved == 2
    finish(other)
    assert status(job) == JobStatus.WAITING
    finish(flaky)
    assert status(job) == JobStatus.PENDING


def test_a_dependency_can_override_the_jobs_failure_policy():
    optional, required = enqueue("tests.noop"), enqueue("tests.noop")
    job = enqueue("tests.noop", depends_on=[Dependency(optional, on_failure="run"), required])

    finish(optional, JobStatus.FAILED)
    assert status(job) == JobStatus.WAITING
    finish(required, JobStatus.FAILED)
    assert status(job) == JobStatus.CANCELLED


def test_retrying_the_failed_job_resumes_the_workflow():
    first = enqueue("tests.noop")
    second = enqueue("tests.noop", depends_on=[first])
    third = enqueue("tests.noop", depends_on=[second])
    finish(first, JobStatus.FAILED)

    assert Job.objects.filter(pk=first.pk).retry() == 1

    assert [status(job) for job in (first, second, third)] == [
        JobStatus.PENDING,
        JobStatus.WAITING,
        JobStatus.WAITING,
    ]
    resumed = Job.objects.get(pk=third.pk)
    assert (resumed.last_error, resumed.completed_at) == ("", None)
    finish(first)
    assert status(second) == JobStatus.PENDING


def test_a_job_cancelled_by_its_dependency_is_cancelled_again_when_retried_alone():
    first = enqueue("tests.noop")
    second = enqueue("tests.noop", depends_on=[first])
    finish(first, JobStatus.FAILED)

    Job.objects.filter(pk=second.pk).retry()

    assert status(second) == JobStatus.CANCELLED
    assert JobWait.objects.get(job=second).cancelled_by_id == first.id


def test_a_job_retried_after_its_dependency_completed_is_pending():
    first = enqueue("tests.noop")
    second = enqueue("tests.noop", depends_on=[first])
    finish(first)
    finish(second, JobStatus.FAILED)

    Job.objects.filter(pk=second.pk).retry()

    assert status(second) == JobStatus.PENDING


def test_retrying_a_waiting_job_cancelled_by_staff_puts_it_back_to_waiting():
    first = enqueue("tests.noop")
    second = enqueue("tests.noop", depends_on=[first])
    assert Job.objects.filter(pk=second.pk).cancel() == 1
    assert status(second) == JobStatus.CANCELLED

    Job.objects.filter(pk=second.pk).retry()

    assert status(second) == JobStatus.WAITING
    finish(first)
    assert status(second) == JobStatus.PENDING


def test_cancelling_a_job_cancels_what_depends_on_it():
    first = enqueue("tests.noop")
    second = enqueue("tests.noop", depends_on=[first])

    Job.objects.filter(pk=first.pk).cancel()

    assert status(second) == JobStatus.CANCELLED


def test_a_dependency_that_failed_before_the_enqueue_cancels_the_job_at_birth():
    first = enqueue("tests.noop")
    finish(first, JobStatus.FAILED)

    jobs = enqueue_many(
        [
            {"job_type": "tests.noop", "depends_on": [first]},
            {"job_type": "tests.noop", "depends_on": [0]},
            {"job_type": "tests.noop", "depends_on": [first], "on_dependency_failure": "run"},
        ]
    )

    assert [job.status for job in jobs] == [
        JobStatus.CANCELLED,
        JobStatus.CANCELLED,
        JobStatus.PENDING,
    ]
    assert jobs[1].last_error == (
        f"Cancelled: job {jobs[0].id}, which it depends on, was cancelled because job "
        f"{first.id} is failed."
    )
    Job.objects.filter(pk=first.pk).retry()
    assert [status(job) for job in jobs[:2]] == [JobStatus.WAITING, JobStatus.WAITING]


def test_a_job_after_one_not_needed_at_birth_is_cancelled_at_birth_with_it():
    first = enqueue("tests.noop")
    finish(first)

    jobs = enqueue_many(
        [
            {"job_type": "tests.noop", "depends_on": [Dependency(first, on_failure="run_only")]},
            {"job_type": "tests.noop", "depends_on": [0]},
        ]
    )

    assert [job.status for job in jobs] == [JobStatus.CANCELLED, JobStatus.CANCELLED]
    assert jobs[0].last_error.startswith("Not run: it runs only after a failure")
    # In the words the database uses when a job is cancelled as not needed later.
    assert jobs[1].last_error == f"Cancelled: job {jobs[0].id}, which it depends on, is cancelled."
    assert [status(job) for job in jobs] == [JobStatus.CANCELLED, JobStatus.CANCELLED]


def test_the_jobs_returned_are_the_rows_written():
    failed = enqueue("tests.noop")
    finish(failed, JobStatus.FAILED)

    jobs = enqueue_many(
        [
            {"job_type": "tests.noop", "data": {"n": 1}, "priority": 7},
            {"job_type": "tests.noop", "depends_on": [0], "delay": 60},
            {"job_type": "tests.noop", "depends_on": [failed]},
        ]
    )

    fields = [field.attname for field in Job._meta.concrete_fields]
    for job in jobs:
        stored = Job.objects.get(pk=job.pk)
        assert {name: getattr(job, name) for name in fields} == {
            name: getattr(stored, name) for name in fields
        }


def test_jobs_outside_workflows_are_left_alone():
    plain = enqueue("tests.noop")

    finish(plain, JobStatus.FAILED)
    Job.objects.filter(pk=plain.pk).retry()

    assert status(plain) == JobStatus.PENDING
    assert Job.objects.get(pk=plain.pk).workflow_id is None


def test_an_empty_depends_on_enqueues_a_plain_job():
    job = enqueue("tests.noop", depends_on=[])

    assert (job.status, job.workflow_id) == (JobStatus.PENDING, None)


@pytest.mark.django_db(transaction=True)
def test_a_worker_runs_a_chain_in_order():
    jobs = enqueue_many(
        [{"job_type": "tests.record", "data": {"step": 0}}]
        + [
            {"job_type": "tests.record", "data": {"step": i}, "depends_on": [i - 1]}
            for i in range(1, 5)
        ]
    )

    Worker(concurrency=4, burst=True).run()

    assert {status(job) for job in jobs} == {JobStatus.COMPLETED}
    started = list(Execution.objects.order_by("started_at").values_list("job_id", flat=True))
    assert started == [job.id for job in jobs]


@pytest.mark.django_db(transaction=True)
def test_two_dependencies_completing_at_once_release_the_job_once(other_connection):
    first, second = enqueue("tests.noop"), enqueue("tests.noop")
    callback = enqueue("tests.noop", depends_on=[first, second])
    done = threading.Event()

    def finish_second() -> None:
        other_connection.execute(
            "UPDATE pgqueue_jobs SET status = 'completed' WHERE id = %s", [second.id]
        )
        done.set()

    with transaction.atomic():
        finish(first)
        thread = threading.Thread(target=finish_second)
        thread.start()
        # The second finish waits for the first's lock on the callback's counter.
        assert not done.wait(0.5)
        assert status(callback) == JobStatus.WAITING
    thread.join(10)

    assert done.is_set()
    assert status(callback) == JobStatus.PENDING
    assert not JobWait.objects.filter(job=callback).exists()
    assert all(edge.resolved for edge in JobDependency.objects.filter(job=callback))


@pytest.mark.django_db(transaction=True)
def test_a_dependency_finishing_while_the_enqueue_is_open_releases_the_job(other_connection):
    first = enqueue("tests.noop")
    done = threading.Event()

    def finish_first() -> None:
        other_connection.execute(
            "UPDATE pgqueue_jobs SET status = 'completed' WHERE id = %s", [first.id]
        )
        done.set()

    with transaction.atomic():
        second = enqueue("tests.noop", depends_on=[first])
        thread = threading.Thread(target=finish_first)
        thread.start()
        assert not done.wait(0.5)  # the enqueue holds the dependency until it commits
    thread.join(10)

    assert done.is_set()
    assert status(second) == JobStatus.PENDING


class TestBadInput:
    def assert_rejected(self, field: str, message: str, call) -> None:
        jobs = Job.objects.count()
        with pytest.raises(InvalidJobError) as raised:
            call()
        assert raised.value.field == field
        assert message in str(raised.value)
        assert Job.objects.count() == jobs
        assert not JobDependency.objects.exists()

    def test_a_cycle(self):
        specs = [
            {"job_type": "tests.noop", "depends_on": [1]},
            {"job_type": "tests.noop", "depends_on": [0]},
        ]
        self.assert_rejected(
            "specs[0].depends_on", "depend on each other in a cycle", lambda: enqueue_many(specs)
        )

    def test_an_index_naming_the_spec_itself(self):
        specs = [{"job_type": "tests.noop", "depends_on": [0]}]
        self.assert_rejected("specs[0].depends_on[0]", "names itself", lambda: enqueue_many(specs))

    def test_an_index_out_of_range(self):
        specs = [{"job_type": "tests.noop", "depends_on": [5]}]
        self.assert_rejected("specs[0].depends_on[0]", "names no spec", lambda: enqueue_many(specs))

    def test_a_job_that_does_not_exist(self):
        missing = uuid.uuid4()
        self.assert_rejected(
            "depends_on[0]",
            f"no job {missing} in the jobs database",
            lambda: enqueue("tests.noop", depends_on=[missing]),
        )

    def test_text_that_is_not_a_job_id(self):
        self.assert_rejected(
            "depends_on[0]", "is not a job id", lambda: enqueue("tests.noop", depends_on=["x"])
        )

    def test_an_index_outside_enqueue_many(self):
        self.assert_rejected(
            "depends_on[0]",
            "0 is an index, which names a spec of enqueue_many()",
            lambda: enqueue("tests.noop", depends_on=[0]),
        )

    def test_something_that_is_not_a_job(self):
        self.assert_rejected(
            "depends_on[0]",
            "must be a Job, a job id or the index of a spec",
            lambda: enqueue("tests.noop", depends_on=[1.5]),
        )

    def test_a_mapping(self):
        self.assert_rejected(
            "depends_on", "must be a list", lambda: enqueue("tests.noop", depends_on={"a": 1})
        )

    def test_a_unique_key(self):
        first = enqueue("tests.noop")
        self.assert_rejected(
            "unique_key",
            "cannot have a unique key",
            lambda: enqueue("tests.noop", depends_on=[first], unique_key="k"),
        )

    def test_a_unique_key_in_a_batch_with_dependencies(self):
        specs = [
            {"job_type": "tests.noop", "unique_key": "k"},
            {"job_type": "tests.noop", "depends_on": [0]},
        ]
        self.assert_rejected(
            "specs[0].unique_key", "cannot have unique keys", lambda: enqueue_many(specs)
        )

    def test_a_failure_policy_without_dependencies(self):
        self.assert_rejected(
            "on_dependency_failure",
            "needs depends_on",
            lambda: enqueue("tests.noop", on_dependency_failure="run"),
        )

    def test_an_unknown_failure_policy(self):
        first = enqueue("tests.noop")
        self.assert_rejected(
            "depends_on[0].on_failure",
            "must be one of 'cancel', 'run', 'run_only'",
            lambda: enqueue("tests.noop", depends_on=[Dependency(first, on_failure="skip")]),
        )

    def test_one_job_twice_with_two_policies(self):
        first = enqueue("tests.noop")
        self.assert_rejected(
            "depends_on[1]",
            "again with another on_failure",
            lambda: enqueue("tests.noop", depends_on=[first, Dependency(first, on_failure="run")]),
        )

    def test_a_job_of_another_database(self):
        first = enqueue("tests.noop")
        first._state.db = "jobs"
        self.assert_rejected(
            "depends_on[0]",
            "is a job of the database 'jobs'",
            lambda: enqueue("tests.noop", depends_on=[first]),
        )

    def test_inside_atomic_the_transaction_stays_usable(self):
        with transaction.atomic():
            first = enqueue("tests.noop")
            with pytest.raises(InvalidJobError):
                enqueue_many([{"job_type": "tests.noop", "depends_on": [0]}])
            with pytest.raises(InvalidJobError):
                enqueue("tests.noop", depends_on=[uuid.uuid4()])
            second = enqueue("tests.noop", depends_on=[first])
        assert status(second) == JobStatus.WAITING

    def test_a_duplicate_dependency_counts_once(self):
        first = enqueue("tests.noop")
        job = enqueue("tests.noop", depends_on=[first, first.id, str(first.id)])
        assert JobWait.objects.get(job=job).unresolved == 1


class TestAdmin:
    def test_a_job_page_shows_what_it_waits_for_and_what_waits_for_it(self, admin_client):
        first = enqueue("tests.noop")
        second = enqueue("tests.noop", depends_on=[first])
        third = enqueue("tests.noop", depends_on=[Dependency(second, on_failure="run")])

        page = admin_client.get(reverse("admin:django_pgqueue_job_change", args=[second.pk]))

        html = page.content.decode()
        assert str(second.workflow_id) in html
        waits_for, needed_by = html.split("Needed by", 1)
        assert f'title="{first.pk}"' in waits_for and f'title="{third.pk}"' not in waits_for
        assert f'title="{third.pk}"' in needed_by and "runs even if it fails" in needed_by
        assert "Waits for 1 job." in html

    def test_a_job_outside_workflows_has_no_workflow_section(self, admin_client):
        job = enqueue("tests.noop")

        page = admin_client.get(reverse("admin:django_pgqueue_job_change", args=[job.pk]))

        assert "Needed by" not in page.content.decode()

    def test_the_workflow_link_lists_the_jobs_of_the_workflow(self, admin_client):
        first = enqueue("tests.noop")
        second = enqueue("tests.noop", depends_on=[first])
        enqueue("tests.noop")

        page = admin_client.get(
            reverse("admin:django_pgqueue_job_changelist"), {"workflow": str(second.workflow_id)}
        )

        listed = {job.pk for job in page.context["cl"].result_list}
        assert listed == {first.pk, second.pk}

    def test_a_workflows_page_lists_its_steps_and_what_each_waits_for(self, admin_client):
        workflow = chord([Step("tests.noop") for _ in range(7)], Step("tests.noop")).enqueue()
        first = workflow.jobs[0]
        Job.objects.filter(pk=first.pk).update(status=JobStatus.COMPLETED)
        follow = enqueue("tests.noop", depends_on=[first])

        page = admin_client.get(reverse("admin:django_pgqueue_job_workflow", args=[workflow.id]))

        assert page.status_code == 200
        rows = page.context["rows"]
        assert [row["job"].pk for row in rows] == [job.pk for job in workflow.jobs] + [follow.pk]
        assert rows[-1]["waits_for"] == [{"number": 1, "id": first.pk}]
        callback = rows[-2]
        assert (callback["waits_for"], callback["waits_more"]) == ([], 7)
        assert page.context["total"] == 9
        counts = {count["status"]: count["count"] for count in page.context["counts"]}
        assert counts == {"waiting": 1, "pending": 7, "completed": 1}
        html = page.content.decode()
        assert "and 7 jobs" not in html and "7 jobs" in html
        assert f'data-pgqueue-job="{first.pk}"' in html  # refreshed live

    def test_a_job_page_links_to_its_workflow(self, admin_client):
        first = enqueue("tests.noop")
        second = enqueue("tests.noop", depends_on=[first])

        page = admin_client.get(reverse("admin:django_pgqueue_job_change", args=[second.pk]))

        url = reverse("admin:django_pgqueue_job_workflow", args=[second.workflow_id])
        assert f'href="{url}"' in page.content.decode()

    def test_an_unknown_workflow_is_a_404_page(self, admin_client):
        missing = uuid.uuid4()

        page = admin_client.get(reverse("admin:django_pgqueue_job_workflow", args=[missing]))

        assert page.status_code == 404
        assert f"No workflow with id “{missing}”." in page.content.decode()

    def test_a_malformed_workflow_id_lists_nothing(self, admin_client):
        enqueue("tests.noop")

        page = admin_client.get(reverse("admin:django_pgqueue_job_changelist"), {"workflow": "x"})

        assert list(page.context["cl"].result_list) == []

    def test_the_cancel_action_cancels_a_waiting_job_and_its_dependents(self, admin_client):
        first = enqueue("tests.noop")
        second = enqueue("tests.noop", depends_on=[first])
        third = enqueue("tests.noop", depends_on=[second])

        admin_client.post(
            reverse("admin:django_pgqueue_job_changelist"),
            {"action": "cancel_jobs", "_selected_action": [str(second.pk)]},
        )

        assert [status(job) for job in (first, second, third)] == [
            JobStatus.PENDING,
            JobStatus.CANCELLED,
            JobStatus.CANCELLED,
        ]


@pytest.mark.django_db(transaction=True)
def test_a_worker_warns_when_releases_notify_another_channel(pgqueue_settings, caplog):
    pgqueue_settings(NOTIFY_CHANNEL="shop_jobs")

    with caplog.at_level("WARNING", logger="django_pgqueue.worker"):
        Worker(burst=True).run()

    assert "the database notifies workflow steps it releases on 'pgqueue_jobs'" in caplog.text
    assert "SET pgqueue.notify_channel = 'shop_jobs'" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_a_worker_on_the_default_channel_does_not_warn(caplog):
    with caplog.at_level("WARNING", logger="django_pgqueue.worker"):
        Worker(burst=True).run()

    assert "notify_channel" not in caplog.text
