"""How a worker paces the jobs it claims under rate limits.

Two things: when the first full window of its job types and queues has room (it
claims then, not at its next poll), and how soon it promises to start the jobs of a
claim (the claim's ``p_start_within``), so that jobs under a rate limit can be
prefetched too. The claim counts such a job at that later moment and returns it with
that ``started_at``: a slot must start it by then, or hand it back unstarted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..models import Job

#: What handing a job to a slot costs besides its run (a thread's wake-up, the
#: bookkeeping), in seconds: part of how soon a prefetched job starts.
HANDOFF_SECONDS = 0.0002
#: Jobs under a rate limit are prefetched only with a start-by moment between these
#: many seconds after the claim is sent: how long recent claims took to come back, plus
#: twice the expected wait of the batch's last job; at least the first (a slot's
#: wake-up can lag), at most the second (a longer one would hold the limits' windows
#: too long; the batch then only fills free slots).
RATED_START_WITHIN = (0.01, 0.1)
#: Weight of the newest claim in the smoothed time claims take, once it is falling.
CLAIM_SMOOTHING = 0.1


@dataclass
class RatePacing:
    """A worker's view of the rate limits it claims under."""

    #: Whether any rate limit exists (checked at start and by the heartbeat).
    limited: bool = False
    #: When the first full window of the worker's job types and queues has room
    #: (``time.monotonic()``), from the last claim; None: none was full.
    room_at: float | None = None
    #: Seconds a claim took to come back: quick to rise, slow to fall.
    claim_seconds: float = 0.0

    def claim_came_back(self, took: float) -> None:
        """Record that a claim took ``took`` seconds, from sending to its answer."""
        smoothed = self.claim_seconds + CLAIM_SMOOTHING * (took - self.claim_seconds)
        self.claim_seconds = max(took, smoothed)

    def room_in(self, seconds: float | None, now: float) -> None:
        """Record the wait the claim's ``pgqueue_rate_limit_wait()`` returned."""
        self.room_at = None if seconds is None else now + seconds

    def wake_at(self) -> float | None:
        """When to claim again for a full window, or None: only while limits exist (a
        time left from before the last limit went would be past: a spin)."""
        return self.room_at if self.limited else None

    def start_within(
        self, *, asked: int, free: int, held: int, concurrency: int, average: float | None
    ) -> float | None:
        """Seconds within which a worker holding ``held`` jobs, with ``free`` of its
        ``concurrency`` slots idle and jobs lately running ``average`` seconds, starts
        every job of a claim of ``asked``; None (rate-limited jobs only into free slots)
        while no limit exists, the batch fits the free slots, or it could not start them
        all soon."""
        if not self.limited or average is None or asked <= free:
            return None
        # The start-by moment counts from the claim's moment on the server, which the
        # worker only knows to be after it sent the claim: the claim's own time first.
        # Then the batch's last job starts once every job ahead of it has had a slot.
        ahead = max(held + asked - concurrency, 0)
        expected = ahead * (average + HANDOFF_SECONDS) / concurrency
        shortest, longest = RATED_START_WITHIN
        within = max(self.claim_seconds + 2 * expected, shortest)
        return within if within <= longest else None


def start_by(job: Job, sent_at: float) -> float | None:
    """The ``time.monotonic()`` by which ``job`` must start, or None when the claim
    counted it at its own moment (``started_at`` later than ``claimed_at`` says it was
    counted then): from ``sent_at``, when its claim was sent (before the server's
    moment, so never late)."""
    started, claimed = job.started_at, job.claimed_at
    if started is None or claimed is None or started <= claimed:
        return None
    return sent_at + (started - claimed).total_seconds()
