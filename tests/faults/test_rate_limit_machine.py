"""Random interleavings of the job state machine's steps under a rate limit
(tests/faults/test_state_machine.py's steps, plus rate changes and the passing of time),
all through the real SQL: read back from the log of starts, no window of the limit ever
holds more claims than it allows, and each claimed job's start is in the log, at its
claim or, prefetched with a start-by moment, at that moment (hypothesis; bounded).

Time passes without sleeping: the "advance" step moves every logged start, and every
job's claim and start times, the same amount into the past, which is what the claim's
window sees when that much time has gone by.
"""

from __future__ import annotations

import pytest
from django.db import connection
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, rule, run_state_machine_as_test

from django_pgqueue.rate_limits import override_rate_limit

from .test_state_machine import EXAMPLES, MACHINE_SETTINGS, STEPS, JobStateMachine

pytestmark = pytest.mark.django_db

# The limits the machine may set, by scope: tests.noop's job type, or its queue.
NAMES = {"job_type": "tests.noop", "queue": "default"}

# Logged starts of the limit whose window (ending at that start) holds more than max_jobs.
_OVERFULL = """
SELECT a.started_at, sum(b.jobs)
  FROM pgqueue_rate_starts AS a
  JOIN pgqueue_rate_limits AS r ON r.scope = a.scope AND r.name = a.name
  JOIN pgqueue_rate_starts AS b
    ON b.scope = a.scope AND b.name = a.name
   AND b.started_at > a.started_at - r.period_seconds * interval '1 second'
   AND b.started_at <= a.started_at
 WHERE a.scope = %s AND a.name = %s
 GROUP BY a.started_at, r.max_jobs
HAVING sum(b.jobs) > r.max_jobs
"""


class RatedJobStateMachine(JobStateMachine):
    """The job state machine, with a rate limit on its jobs' job type or queue."""

    @initialize(scope=st.sampled_from(sorted(NAMES)), jobs=st.integers(1, 4))
    def declare_the_rate(self, scope: str, jobs: int) -> None:
        # The examples share one transaction: start each from no rate and an empty log.
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM pgqueue_rate_limits")
            cursor.execute("DELETE FROM pgqueue_rate_starts")
        self.scope, self.name = scope, NAMES[scope]
        override_rate_limit(scope, self.name, f"{jobs}/10s")
        # Lowering a rate never takes back starts already made: only later windows count.
        self.rate_lowered = False
        self.jobs = jobs

    @rule(jobs=st.integers(1, 4))
    def change_the_rate(self, jobs: int) -> None:
        override_rate_limit(self.scope, self.name, f"{jobs}/10s")
        self.rate_lowered = self.rate_lowered or jobs < self.jobs
        self.jobs = jobs

    @rule(seconds=st.sampled_from([1, 4, 9, 11]))
    def advance(self, seconds: int) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE pgqueue_rate_starts SET started_at = started_at - %s * interval '1s', "
                "full_until = full_until - %s * interval '1s'",
                [seconds, seconds],
            )
            cursor.execute(
                "UPDATE pgqueue_jobs SET claimed_at = claimed_at - %s * interval '1s', "
                "started_at = started_at - %s * interval '1s'",
                [seconds, seconds],
            )

    @invariant()
    def no_window_holds_more_starts_than_the_rate(self) -> None:
        if self.rate_lowered:
            return
        with connection.cursor() as cursor:
            cursor.execute(_OVERFULL, [self.scope, self.name])
            assert cursor.fetchall() == []

    @invariant()
    def jobs_in_flight_started_at_a_logged_moment(self) -> None:
        """Claimed at the moment logged, or (prefetched) started by the later one logged."""
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT j.id FROM pgqueue_jobs AS j WHERE j.status IN ('claimed', 'running') "
                "AND NOT EXISTS (SELECT 1 FROM pgqueue_rate_starts AS s "
                "WHERE s.scope = %s AND s.name = %s "
                "AND s.started_at IN (j.claimed_at, j.started_at))",
                [self.scope, self.name],
            )
            assert cursor.fetchall() == []


def test_random_interleavings_keep_rate_limits(figures):
    run_state_machine_as_test(RatedJobStateMachine, settings=MACHINE_SETTINGS)
    figures(examples=EXAMPLES, steps_per_example=STEPS)
