"""Overriding concurrency limits at run time: ``override_limit()`` and the admin. The
override wins over the declared limit, survives workers' syncs, and the claim keeps it
from the next call on."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.urls import reverse

from django_pgqueue import enqueue_many
from django_pgqueue.exceptions import InvalidArgumentError
from django_pgqueue.limits import (
    LimitState,
    limit_states,
    override_limit,
    stored_limits,
    sync_declared_limits,
)
from django_pgqueue.models import ConcurrencyLimit
from tests.test_limits import drain_then_runs, most_at_once, worker_settings
from tests.workers import WorkerProcess, wait_for

pytestmark = pytest.mark.django_db


def claim(batch_size: int = 10) -> list[Any]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT id FROM claim_job_batch('w', NULL, %s, NULL)", [batch_size])
        return [row[0] for row in cursor.fetchall()]


def test_an_override_wins_over_the_declared_limit_at_the_next_claim(make_job, pgqueue_settings):
    pgqueue_settings(QUEUE_LIMITS={"video": 5})
    sync_declared_limits("default")
    jobs = [make_job(queue="video") for _ in range(4)]

    state = override_limit("queue", "video", 1)

    assert state == LimitState("queue", "video", declared=5, override=1, max_running=1)
    assert claim() == [jobs[0].id]
    assert claim() == []


def test_a_worker_starting_keeps_the_override_and_updates_the_declared_limit(pgqueue_settings):
    pgqueue_settings(QUEUE_LIMITS={"video": 5})
    sync_declared_limits("default")
    override_limit("queue", "video", 2)

    pgqueue_settings(QUEUE_LIMITS={"video": 8})
    sync_declared_limits("default")

    assert limit_states() == [LimitState("queue", "video", 8, 2, 2)]


def test_clearing_the_override_brings_the_declared_limit_back(pgqueue_settings):
    pgqueue_settings(QUEUE_LIMITS={"video": 5})
    sync_declared_limits("default")
    override_limit("queue", "video", 2)

    state = override_limit("queue", "video", None)

    assert state == LimitState("queue", "video", 5, None, 5)
    assert stored_limits() == {("queue", "video"): 5}


def test_an_override_limits_what_nothing_declares_until_it_is_cleared(make_job):
    jobs = [make_job(job_type="tests.record") for _ in range(3)]

    override_limit("job_type", "tests.record", 1)
    sync_declared_limits("default")  # declares nothing: the override stays

    assert limit_states() == [LimitState("job_type", "tests.record", None, 1, 1)]
    assert claim() == [jobs[0].id]

    assert override_limit("job_type", "tests.record", None) is None
    assert not ConcurrencyLimit.objects.exists()
    assert set(claim()) == {jobs[1].id, jobs[2].id}


def test_a_declared_limit_removed_from_the_code_leaves_its_override(pgqueue_settings):
    pgqueue_settings(QUEUE_LIMITS={"video": 5, "audio": 3})
    sync_declared_limits("default")
    override_limit("queue", "video", 2)

    pgqueue_settings(QUEUE_LIMITS={})
    sync_declared_limits("default")

    assert limit_states() == [LimitState("queue", "video", None, 2, 2)]


@pytest.mark.parametrize(
    ("arguments", "field", "message"),
    [
        (("tenant", "acme", 2), "scope", "must be one of 'queue', 'job_type', 'key', got 'tenant'"),
        (("queue", "has space", 2), "name", "name"),
        (("job_type", "", 2), "name", "name"),
        (("queue", "video", 0), "max_running", "must be an integer from 1 to 1000000"),
        (("queue", "video", -1), "max_running", "must be an integer from 1 to 1000000"),
        (("queue", "video", 1.5), "max_running", "got 1.5"),
        (("queue", "video", True), "max_running", "got True"),
        (("queue", "video", 10**7), "max_running", "got 10000000"),
    ],
)
def test_bad_overrides_are_refused_and_nothing_is_written(arguments, field, message):
    with pytest.raises(InvalidArgumentError, match=message) as excinfo:
        override_limit(*arguments)

    assert excinfo.value.field == field
    assert not ConcurrencyLimit.objects.exists()


def test_migrating_back_keeps_the_limit_enforced_and_forward_again_declares_it(
    pgqueue_settings, transactional_db
):
    pgqueue_settings(QUEUE_LIMITS={"video": 5})
    sync_declared_limits("default")
    override_limit("queue", "video", 2)

    call_command("migrate", "django_pgqueue", "0010", verbosity=0)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT scope, name, max_running FROM pgqueue_limits")
            assert cursor.fetchall() == [("queue", "video", 2)]
    finally:
        call_command("migrate", "django_pgqueue", verbosity=0)

    assert limit_states() == [LimitState("queue", "video", 2, None, 2)]


# -- The admin ---------------------------------------------------------------------------


def change_url(limit: ConcurrencyLimit) -> str:
    return reverse("admin:django_pgqueue_concurrencylimit_change", args=[limit.pk])


def test_the_admin_lists_declared_overridden_and_enforced_limits(staff, pgqueue_settings):
    pgqueue_settings(QUEUE_LIMITS={"video": 5})
    sync_declared_limits("default")
    override_limit("queue", "video", 2)
    client = staff("view_concurrencylimit")

    page = client.get(reverse("admin:django_pgqueue_concurrencylimit_changelist"))

    assert page.status_code == 200
    cells = page.content.decode()
    assert '<td class="field-declared">5</td>' in cells
    assert '<td class="field-override">2</td>' in cells
    assert '<td class="field-max_running">2</td>' in cells


def test_staff_override_a_declared_limit_in_the_admin(staff, pgqueue_settings, make_job):
    pgqueue_settings(QUEUE_LIMITS={"video": 5})
    sync_declared_limits("default")
    limit = ConcurrencyLimit.objects.get()
    client = staff("view_concurrencylimit", "change_concurrencylimit")

    response = client.post(change_url(limit), {"override": "1"})

    assert response.status_code == 302
    assert limit_states() == [LimitState("queue", "video", 5, 1, 1)]
    assert client.post(change_url(limit), {"override": ""}).status_code == 302
    assert limit_states() == [LimitState("queue", "video", 5, None, 5)]


def test_staff_add_an_override_only_limit_and_delete_it(staff):
    client = staff(
        "view_concurrencylimit",
        "add_concurrencylimit",
        "change_concurrencylimit",
        "delete_concurrencylimit",
    )

    added = client.post(
        reverse("admin:django_pgqueue_concurrencylimit_add"),
        {"scope": "queue", "name": "reports", "override": "3"},
    )

    assert added.status_code == 302
    limit = ConcurrencyLimit.objects.get()
    assert (limit.scope, limit.name, limit.declared, limit.max_running) == (
        "queue",
        "reports",
        None,
        3,
    )
    deleted = client.post(
        reverse("admin:django_pgqueue_concurrencylimit_delete", args=[limit.pk]), {"post": "yes"}
    )
    assert deleted.status_code == 302
    assert not ConcurrencyLimit.objects.exists()


def test_the_admin_refuses_a_limit_without_override_or_a_bad_name(staff):
    client = staff("view_concurrencylimit", "add_concurrencylimit")
    url = reverse("admin:django_pgqueue_concurrencylimit_add")

    empty = client.post(url, {"scope": "queue", "name": "reports", "override": ""})
    bad_name = client.post(url, {"scope": "queue", "name": "has space", "override": "2"})
    zero = client.post(url, {"scope": "queue", "name": "reports", "override": "0"})

    assert "Nothing declares this limit" in empty.content.decode()
    assert bad_name.context["adminform"].form.errors["name"]
    assert zero.context["adminform"].form.errors["override"]
    assert not ConcurrencyLimit.objects.exists()


def test_the_bulk_delete_refuses_a_selection_with_a_declared_limit(staff, pgqueue_settings):
    pgqueue_settings(QUEUE_LIMITS={"video": 5})
    sync_declared_limits("default")
    override_limit("queue", "video", 2)
    override_limit("queue", "reports", 3)
    client = staff("view_concurrencylimit", "delete_concurrencylimit")
    changelist = reverse("admin:django_pgqueue_concurrencylimit_changelist")
    everything = {
        "action": "delete_selected",
        "_selected_action": list(ConcurrencyLimit.objects.values_list("pk", flat=True)),
        "post": "yes",
    }

    refused = client.post(changelist, everything)
    only_override = client.post(
        changelist,
        {
            **everything,
            "_selected_action": [ConcurrencyLimit.objects.get(name="reports").pk],
        },
    )

    assert "declared by the code or settings; clear its override instead" in (
        refused.content.decode()
    )
    assert only_override.status_code == 302
    assert limit_states() == [LimitState("queue", "video", 5, 2, 2)]


def test_a_declared_limit_cannot_be_deleted_in_the_admin(staff, pgqueue_settings):
    pgqueue_settings(QUEUE_LIMITS={"video": 5})
    sync_declared_limits("default")
    limit = ConcurrencyLimit.objects.get()
    client = staff("view_concurrencylimit", "delete_concurrencylimit")

    response = client.post(
        reverse("admin:django_pgqueue_concurrencylimit_delete", args=[limit.pk]), {"post": "yes"}
    )

    assert response.status_code == 403
    assert ConcurrencyLimit.objects.exists()


# -- Real worker processes ---------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_worker_processes_keep_an_override_set_while_they_run():
    def start(index: int, job_type: str, declared: int) -> WorkerProcess:
        return WorkerProcess(
            "--concurrency",
            "4",
            "--poll-interval",
            "0.2",
            "--worker-id",
            f"w{index}",
            "--job-types",
            job_type,
            env=worker_settings("queue", "video", declared),
        )

    workers = [start(0, "tests.record", 3), start(1, "tests.durable", 3)]
    try:
        wait_for(lambda: limit_states() == [LimitState("queue", "video", 3, None, 3)])
        override_limit("queue", "video", 1)
        # A worker started now with other settings rewrites the declared limit only.
        workers.append(start(2, "tests.record", 4))
        wait_for(lambda: limit_states() == [LimitState("queue", "video", 4, 1, 1)])
        jobs = enqueue_many(
            [
                {"job_type": job_type, "queue": "video", "data": {"sleep": 0.05}}
                for job_type in ("tests.record", "tests.durable")
                for _ in range(8)
            ]
        )
    except BaseException:
        for worker in workers:
            worker.stop()
        raise
    executions = drain_then_runs(jobs, workers)

    assert len(executions) == len(jobs)
    assert most_at_once([(start, end) for start, end, _ in executions]) == 1
    assert len({worker_id for _, _, worker_id in executions}) >= 2
    assert limit_states() == [LimitState("queue", "video", 4, 1, 1)]
