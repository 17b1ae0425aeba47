"""Property-based tests over the whole input domain of ``enqueue`` and ``enqueue_many``.

Every input either round-trips through a worker unchanged (the handler sees the payload
and time it was given) or raises :class:`InvalidJobError` with nothing written.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.db.models.functions import Now
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from django_pgqueue import InvalidJobError, enqueue, enqueue_many
from django_pgqueue.models import Job, JobStatus
from django_pgqueue.worker import Worker
from tests.testapp.jobs import ECHOED

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLES = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Scalars as users pass them, with every troublesome value: NaN, infinities, huge and
# tiny floats, integers past 64 bits and past Python's 4,300-digit limit, any character
# (NUL and lone surrogates included). Half the draws are of values that should be
# stored, so that both outcomes are well covered.
clean_text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"))
clean_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False, min_value=-1e15, max_value=1e15),
    clean_text,
)
any_scalars = st.one_of(
    clean_scalars,
    st.integers(min_value=10**18).map(lambda n: n ** st_power(n)),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(),
)


def st_power(n: int) -> int:
    return 1 + n % 300  # up to about 5,700 digits


def json_like(scalars: st.SearchStrategy[Any], keys: st.SearchStrategy[Any]) -> Any:
    return st.recursive(
        scalars,
        lambda children: (
            st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4)
        ),
        max_leaves=12,
    )


clean_json = json_like(clean_scalars, clean_text)
any_json = json_like(any_scalars, st.one_of(st.text(), st.integers(), st.none(), st.booleans()))


def nested(levels: int) -> Any:
    value: Any = 1
    for level in range(levels):
        value = [value] if level % 2 else {"k": value}
    return value


payloads = st.one_of(
    st.dictionaries(clean_text, clean_json, max_size=5),
    st.dictionaries(st.text(), any_json, max_size=5),
    st.integers(min_value=1, max_value=400).map(lambda n: {"deep": nested(n)}),
    any_json,  # not a dict at all, mostly
)
offsets = st.timedeltas(min_value=-timedelta(hours=23, minutes=59), max_value=timedelta(hours=23))
times = st.one_of(
    st.none(),
    st.datetimes(timezones=st.one_of(st.none(), st.builds(timezone, offsets), st.timezones())),
)
names = st.one_of(
    st.just("default"), st.from_regex(r"[a-z0-9_][a-z0-9_.:\-]{0,110}", fullmatch=True), st.text()
)
unique_keys = st.one_of(st.none(), clean_text.filter(bool), st.text(max_size=300))


def _run_worker() -> None:
    Worker(burst=True, concurrency=1).run()


def _due_for_the_worker(job: Job, run_at: Any) -> Any:
    """Make ``job`` due if it is scheduled for later; the ``run_at`` the worker must show.

    A job in the past keeps its time (the worker reads it back as given); one in the
    future is moved to now, its stored time having been checked already.
    """
    moved = Job.objects.filter(pk=job.pk, run_at__gt=Now()).update(run_at=Now())
    return None if moved else run_at


def _same_instant(shown: datetime, given: datetime) -> bool:
    """Whether two aware datetimes name one instant. Python never finds a local time in a
    gap or fold of its zone (a DST change) equal to a time of another zone (PEP 495),
    though it converts it to UTC as PostgreSQL stores it."""
    return shown.astimezone(UTC) == given.astimezone(UTC)


def _assert_round_trip(job: Job, data: Any, run_at: Any, queue: str) -> None:
    stored = Job.objects.get(pk=job.pk)
    assert stored.status == JobStatus.COMPLETED, stored.last_error
    seen = ECHOED[str(job.pk)]
    assert seen["data"] == ({} if data is None else data)
    assert seen["queue"] == queue
    if run_at is not None:
        assert _same_instant(seen["run_at"], run_at), (seen["run_at"], run_at)


#: A local time in a DST gap (Atyrau moved from +04 to +05 at 2 a.m. that day): Python
#: converts it to UTC, but finds it equal to no time of another zone.
IN_A_GAP = datetime(2000, 3, 26, 2, 0, tzinfo=ZoneInfo("Asia/Atyrau"))


@EXAMPLES
@example(data=None, run_at=IN_A_GAP, queue="default", unique_key=None)
@given(data=payloads, run_at=times, queue=names, unique_key=unique_keys)
def test_enqueue_round_trips_or_rejects_with_nothing_written(data, run_at, queue, unique_key):
    Job.objects.all().delete()
    try:
        job = enqueue(
            "tests.echo",
            data,
            run_at=run_at,
            queue=queue,
            unique_key=unique_key,
        )
    except InvalidJobError as exc:
        event(f"rejected: {exc.field}")
        assert not Job.objects.exists()
        return
    event("accepted")
    stored = Job.objects.get(pk=job.pk)
    assert (stored.data, stored.queue, stored.unique_key) == (
        {} if data is None else data,
        queue,
        unique_key,
    )
    if run_at is not None:
        assert _same_instant(stored.run_at, run_at), (stored.run_at, run_at)
    run_at = _due_for_the_worker(job, run_at)
    _run_worker()
    _assert_round_trip(job, data, run_at, queue)


@EXAMPLES
@example(specs=[{"job_type": "tests.echo", "run_at": IN_A_GAP}])
@given(
    specs=st.lists(
        st.fixed_dictionaries(
            {"job_type": st.just("tests.echo")},
            optional={"data": payloads, "run_at": times, "queue": names},
        ),
        min_size=1,
        max_size=6,
    )
)
def test_enqueue_many_round_trips_or_rejects_the_whole_batch(specs):
    Job.objects.all().delete()
    try:
        jobs = enqueue_many(specs)
    except InvalidJobError as exc:
        event(f"rejected: {exc.field.partition('.')[2]}")
        assert not Job.objects.exists()
        return
    event("accepted")
    shown = [
        _due_for_the_worker(job, spec.get("run_at")) for job, spec in zip(jobs, specs, strict=True)
    ]
    _run_worker()
    for job, spec, run_at in zip(jobs, specs, shown, strict=True):
        _assert_round_trip(job, spec.get("data"), run_at, spec.get("queue") or "default")
