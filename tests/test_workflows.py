"""Chains, groups and chords: steps written as one graph, run in order by workers, the
results of earlier steps read by later ones."""

from __future__ import annotations

import pytest
from django.db import transaction

from django_pgqueue import InvalidJobError, Step, batch, chain, chord, enqueue_many, group
from django_pgqueue.inserts import COPY_PART_ROWS
from django_pgqueue.models import Job, JobDependency, JobStatus, JobWait
from django_pgqueue.registry import find_definition
from django_pgqueue.testing import drain
from django_pgqueue.worker import Worker
from django_pgqueue.workflows import plan as workflow_plan

pytestmark = pytest.mark.django_db


def add(n: int, **options) -> Step:
    return Step("tests.accumulate", {"n": n}, **options)


def waits_for(job: Job) -> set:
    return set(JobDependency.objects.filter(job=job).values_list("dependency_id", flat=True))


def test_a_chain_makes_each_step_wait_for_the_one_before():
    workflow = chain(add(1), add(2), add(3)).enqueue()

    first, second, third = workflow.jobs
    assert [job.status for job in workflow.jobs] == ["pending", "waiting", "waiting"]
    assert (waits_for(first), waits_for(second), waits_for(third)) == (
        set(),
        {first.id},
        {second.id},
    )
    assert {job.workflow_id for job in workflow.jobs} == {workflow.id}


def test_forms_nest_a_step_after_a_group_waits_for_every_member():
    workflow = chain(add(1), group(add(2), chain(add(3), add(4))), add(5)).enqueue()

    a, b, c, d, e = workflow.jobs
    assert waits_for(b) == waits_for(c) == {a.id}
    assert waits_for(d) == {c.id}
    assert waits_for(e) == {b.id, d.id}


def test_a_group_runs_side_by_side_in_one_workflow():
    workflow = group(add(n) for n in range(3)).enqueue()

    assert [job.status for job in workflow.jobs] == ["pending"] * 3
    assert not JobDependency.objects.exists()
    assert len({job.workflow_id for job in workflow.jobs}) == 1


def test_the_options_of_the_workflow_apply_to_steps_that_do_not_set_their_own():
    workflow = chain(add(1), add(2, priority=7)).enqueue(
        queue="flows", priority=3, on_dependency_failure="run"
    )

    assert [(job.queue, job.priority) for job in workflow.jobs] == [("flows", 3), ("flows", 7)]
    assert JobDependency.objects.get().on_failure == "run"


def test_a_step_can_also_wait_for_a_job_that_exists():
    earlier = Step("tests.noop")
    (existing,) = group(earlier).enqueue().jobs

    workflow = chain(add(1, depends_on=[existing]), add(2)).enqueue()

    assert waits_for(workflow.jobs[0]) == {existing.id}


def test_a_job_types_step_is_a_step_of_that_type():
    definition = find_definition("tests.accumulate")

    assert definition.step({"n": 1}, queue="q") == Step("tests.accumulate", {"n": 1}, queue="q")


def test_cancelling_a_workflow_cancels_every_job_not_finished():
    workflow = chain(add(1), add(2), add(3)).enqueue()
    Job.objects.filter(pk=workflow.jobs[0].pk).update(status=JobStatus.COMPLETED)

    assert workflow.cancel() == 2

    statuses = [Job.objects.get(pk=job.pk).status for job in workflow.jobs]
    assert statuses == ["completed", "cancelled", "cancelled"]


def test_a_workflow_exists_only_if_the_transaction_commits():
    with pytest.raises(RuntimeError), transaction.atomic():
        chain(add(1), add(2)).enqueue()
        raise RuntimeError

    assert not Job.objects.exists()


def test_a_chain_passes_each_result_to_the_next_step():
    chain(add(n) for n in range(1, 5)).enqueue()

    runs = drain()

    assert [run.result for run in runs] == [
        {"total": 1, "seen": []},
        {"total": 3, "seen": [1]},
        {"total": 6, "seen": [3]},
        {"total": 10, "seen": [6]},
    ]


@pytest.mark.django_db(transaction=True)
def test_a_chords_callback_runs_once_with_the_members_results_in_order():
    workflow = chord([add(n) for n in range(1, 6)], add(0)).enqueue()

    Worker(concurrency=4, burst=True).run()

    callback = Job.objects.get(pk=workflow.jobs[-1].pk)
    assert callback.status == JobStatus.COMPLETED
    assert callback.result == {"total": 15, "seen": [1, 2, 3, 4, 5]}
    assert callback.attempts == 1


def test_dependency_results_are_none_for_jobs_that_did_not_complete():
    workflow = chord([add(1), add(2)], add(0)).enqueue(on_dependency_failure="run")
    first, second, callback = workflow.jobs
    Job.objects.filter(pk=first.pk).update(status=JobStatus.COMPLETED, result={"total": 1})
    Job.objects.filter(pk=second.pk).update(status=JobStatus.FAILED)

    assert Job.objects.get(pk=callback.pk).dependency_results() == {
        first.id: {"total": 1},
        second.id: None,
    }
    assert first.dependency_results() == {}


class TestBadInput:
    def test_an_empty_chain(self):
        with pytest.raises(InvalidJobError, match="needs at least one step"):
            chain()

    def test_something_that_is_not_a_step(self):
        with pytest.raises(TypeError, match="item 1 is 'x'"):
            group(add(1), "x")

    def test_an_unknown_option_of_a_step(self):
        with pytest.raises(TypeError, match="unexpected keyword arguments"):
            Step("tests.noop", colour="red")

    def test_an_index_in_a_steps_depends_on(self):
        with pytest.raises(InvalidJobError) as raised:
            chain(add(1), add(2, depends_on=[0])).enqueue()
        assert raised.value.field == "specs[1].depends_on"
        assert not Job.objects.exists()

    def test_depends_on_for_the_whole_workflow(self):
        with pytest.raises(TypeError, match="takes no depends_on"):
            chain(add(1)).enqueue(depends_on=[])

    def test_an_unregistered_job_type_writes_nothing(self):
        with pytest.raises(InvalidJobError) as raised:
            chain(add(1), Step("tests.nobody")).enqueue()
        assert raised.value.field == "specs[1].job_type"
        assert not Job.objects.exists()


class TestBatch:
    def enqueue(self, **callbacks):
        return batch([add(1), add(2), add(3)], **callbacks).enqueue()

    def test_every_callback_waits_for_every_job_of_the_batch(self):
        workflow = self.enqueue(
            on_complete=Step("tests.noop"),
            on_success=Step("tests.noop"),
            on_failure=Step("tests.noop"),
        )

        *members, complete, success, failure = workflow.jobs
        ids = {job.id for job in members}
        assert waits_for(complete) == waits_for(success) == waits_for(failure) == ids
        policies = {
            job.id: set(JobDependency.objects.filter(job=job).values_list("on_failure", flat=True))
            for job in (complete, success, failure)
        }
        assert policies == {complete.id: {"run"}, success.id: {"cancel"}, failure.id: {"run_only"}}

    def test_when_every_job_completed_on_failure_is_not_needed(self):
        workflow = self.enqueue(on_complete=Step("tests.noop"), on_failure=Step("tests.noop"))
        *members, complete, failure = workflow.jobs

        for job in members:
            Job.objects.filter(pk=job.pk).update(status=JobStatus.COMPLETED)

        assert Job.objects.get(pk=complete.pk).status == JobStatus.PENDING
        not_needed = Job.objects.get(pk=failure.pk)
        assert not_needed.status == JobStatus.CANCELLED
        assert not_needed.last_error.startswith("Not run: it runs only after a failure")

    def test_when_a_job_failed_on_failure_runs_and_on_success_is_cancelled(self):
        workflow = self.enqueue(on_success=Step("tests.noop"), on_failure=Step("tests.noop"))
        first, second, third, success, failure = workflow.jobs

        Job.objects.filter(pk=first.pk).update(status=JobStatus.COMPLETED)
        Job.objects.filter(pk=second.pk).update(status=JobStatus.FAILED)
        Job.objects.filter(pk=third.pk).update(status=JobStatus.CANCELLED)

        assert Job.objects.get(pk=failure.pk).status == JobStatus.PENDING
        assert Job.objects.get(pk=success.pk).status == JobStatus.CANCELLED
        outcome = Job.objects.get(pk=failure.pk).dependency_outcome()
        assert (outcome.completed, outcome.failed, outcome.cancelled) == (
            1,
            [second.id],
            [third.id],
        )
        assert outcome.total == 3

    @pytest.mark.django_db(transaction=True)
    def test_a_worker_runs_the_callback_once_after_the_batch(self):
        workflow = batch(
            [add(1), Step("tests.fail_now"), add(3)],
            on_complete=add(0),
            on_failure=add(100),
        ).enqueue()
        *_, complete, failure = workflow.jobs

        Worker(concurrency=4, burst=True).run()

        complete, failure = (Job.objects.get(pk=job.pk) for job in (complete, failure))
        assert (complete.status, failure.status) == (JobStatus.COMPLETED, JobStatus.COMPLETED)
        assert complete.result == {"total": 4, "seen": [1, 3]}
        assert complete.attempts == failure.attempts == 1

    def test_a_batch_needs_a_callback(self):
        with pytest.raises(InvalidJobError, match="needs a callback"):
            batch([add(1)])

    def test_a_batch_is_not_a_step_of_other_forms(self):
        with pytest.raises(TypeError, match="takes Steps, chains and groups"):
            chain(add(1), batch([add(2)], on_complete=add(3)))

    def test_a_dependency_under_run_only_already_completed_makes_the_job_not_needed(self):
        first = Job.objects.get(pk=group(add(1)).enqueue().jobs[0].pk)
        Job.objects.filter(pk=first.pk).update(status=JobStatus.COMPLETED)

        (job,) = (
            group(Step("tests.noop", depends_on=[first], on_dependency_failure="run_only"))
            .enqueue()
            .jobs
        )

        assert job.status == JobStatus.CANCELLED
        assert job.last_error.startswith("Not run: it runs only after a failure")


class TestLargeWorkflows:
    """Workflows of more than one part (``COPY_PART_ROWS`` steps) are validated and sent
    part by part: written whole, in order, or not at all."""

    def test_a_chord_of_several_parts_is_written_whole_in_order(self):
        members = 2 * COPY_PART_ROWS + 500

        workflow = chord([add(n) for n in range(members)], add(members)).enqueue()

        jobs = list(Job.objects.filter(workflow_id=workflow.id).order_by("created_at"))
        assert [job.id for job in jobs] == [job.id for job in workflow.jobs]
        assert [job.data["n"] for job in jobs] == list(range(members + 1))
        assert {job.status for job in jobs[:-1]} == {JobStatus.PENDING}
        callback = jobs[-1]
        assert callback.status == JobStatus.WAITING
        assert JobWait.objects.get(job=callback).unresolved == members
        assert JobDependency.objects.filter(job=callback).count() == members

    def test_a_bad_step_late_in_a_large_workflow_writes_nothing(self):
        steps = [add(n) for n in range(COPY_PART_ROWS + 500)]

        with transaction.atomic():
            kept = Job.objects.create(job_type="tests.noop")
            with pytest.raises(InvalidJobError) as raised:
                chord([*steps, Step("tests.nobody")], add(0)).enqueue()
            assert Job.objects.count() == 1  # the caller's transaction goes on

        assert raised.value.field == f"specs[{COPY_PART_ROWS + 500}].job_type"
        assert list(Job.objects.all()) == [kept]
        assert not JobDependency.objects.exists()
        assert not JobWait.objects.exists()

    @pytest.mark.parametrize("form", ["chord", "enqueue_many"])
    def test_a_workflow_over_the_size_limit_writes_nothing(self, form, monkeypatch):
        monkeypatch.setattr(workflow_plan, "MAX_WORKFLOW_JOBS", 10)

        with pytest.raises(InvalidJobError, match="jobs with dependencies in one call") as raised:
            if form == "chord":
                chord([add(n) for n in range(10)], add(10)).enqueue()
            else:
                specs = [{"job_type": "tests.noop"} for _ in range(10)]
                enqueue_many([*specs, {"job_type": "tests.noop", "depends_on": list(range(10))}])

        assert raised.value.field == "specs"
        assert not Job.objects.exists()
