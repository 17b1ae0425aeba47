"""Retry delays: exponential backoff with jitter, so failing jobs do not retry in storms."""

from __future__ import annotations

import random
from dataclasses import dataclass

from . import conf


@dataclass(frozen=True)
class Backoff:
    """Delay before retry ``n`` is ``min(max, base * factor ** (n - 1))``, then jittered
    uniformly down to half of that ("equal jitter").

    Exponential backoff for retries, given to ``@job(retry_backoff=...)``. The default
    backoff, used when a job type has no ``retry_backoff``, is
    ``Backoff(base=PGQUEUE["RETRY_BACKOFF_BASE"], max=PGQUEUE["RETRY_BACKOFF_MAX"])``.

    Attributes:
        base: Seconds after the first failed attempt, before jitter.
        factor: What each further attempt multiplies the delay by.
        max: The longest delay, in seconds, before jitter.
        jitter: Whether to wait a random time between half the delay and all of it.

    Raises:
        ValueError: Unless ``base >= 0``, ``max >= 0`` and ``factor >= 1``.
    """

    base: float = 5.0
    factor: float = 2.0
    max: float = 3600.0
    jitter: bool = True

    def __post_init__(self) -> None:
        if self.base < 0 or self.max < 0 or self.factor < 1:
            raise ValueError("Backoff needs base >= 0, max >= 0 and factor >= 1")

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based).

        ``min(max, base * factor ** (attempt - 1))``; with ``jitter``, a random value
        between half of that and all of it.
        """
        exponent = max(attempt - 1, 0)
        # Cap the exponent before computing: factor ** 1000 overflows a float.
        raw = float(self.max if exponent > 64 else min(self.max, self.base * self.factor**exponent))
        if not self.jitter:
            return raw
        return random.uniform(raw / 2, raw)


__all__ = ["Backoff"]


def default_backoff() -> Backoff:
    """The global backoff from ``PGQUEUE['RETRY_BACKOFF_BASE']`` and ``RETRY_BACKOFF_MAX``."""
    settings = conf.get_settings()
    return Backoff(base=settings.RETRY_BACKOFF_BASE, max=settings.RETRY_BACKOFF_MAX)
