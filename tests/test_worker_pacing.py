"""How a worker paces claims under rate limits (worker/pacing.py): how soon it promises
to start what it prefetches, and when each prefetched job must start."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from django_pgqueue.models import Job
from django_pgqueue.worker.pacing import RATED_START_WITHIN, RatePacing, start_by

SHORTEST, LONGEST = RATED_START_WITHIN


def within(pacing: RatePacing, asked: int = 100, free: int = 2, average: float | None = 1e-4):
    return pacing.start_within(asked=asked, free=free, held=0, concurrency=2, average=average)


@pytest.mark.parametrize(
    ("limited", "asked", "average"),
    [
        (False, 100, 1e-4),  # no rate limit: nothing to promise
        (True, 2, 1e-4),  # the batch fits the free slots
        (True, 100, None),  # no job ran yet: no idea how soon
    ],
)
def test_no_promise_without_limits_a_buffer_or_a_run_time(limited, asked, average):
    assert within(RatePacing(limited=limited), asked=asked, average=average) is None


def test_the_promise_covers_the_claims_own_time_and_the_buffers_wait():
    pacing = RatePacing(limited=True)
    quick = within(pacing)
    pacing.claim_came_back(0.03)

    assert quick is not None and SHORTEST <= quick < 0.03
    assert within(pacing) == pytest.approx(0.03 + 2 * 98 * (1e-4 + 2e-4) / 2)


def test_no_promise_when_the_buffer_could_not_start_in_time():
    pacing = RatePacing(limited=True)

    assert within(pacing, average=0.01) is None  # 98 jobs of 10 ms over 2 slots
    pacing.claim_came_back(LONGEST)
    assert within(pacing) is None


def test_slow_claims_raise_the_margin_at_once_and_quick_ones_lower_it_slowly():
    pacing = RatePacing(limited=True)
    pacing.claim_came_back(0.05)
    pacing.claim_came_back(0.01)

    assert pacing.claim_seconds == pytest.approx(0.046)


def test_a_job_must_start_by_its_counted_moment_from_when_the_claim_was_sent():
    claimed = timezone.now()
    prefetched = Job(claimed_at=claimed, started_at=claimed + timedelta(milliseconds=40))
    at_once = Job(claimed_at=claimed, started_at=claimed)

    assert start_by(prefetched, sent_at=100.0) == pytest.approx(100.04)
    assert start_by(at_once, sent_at=100.0) is None
