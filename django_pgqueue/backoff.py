"""Retry delays: exponential backoff with jitter, so failing jobs do not retry in storms."""

from __future__ import annotations

import random
from dataclasses import dataclass

from . import conf


@dataclass(frozen=True)
class Backoff:
    """Delay before retry ``n`` is ``min(max, base * factor ** (n - 1))``, then jittered
    uniformly down to half of that ("equal jitter")."""

    base: float = 5.0
    factor: float = 2.0
    max: float = 3600.0
    jitter: bool = True

    def __post_init__(self) -> None:
        if self.base < 0 or self.max < 0 or self.factor < 1:
            raise ValueError("Backoff needs base >= 0, max >= 0 and factor >= 1")

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        exponent = max(attempt - 1, 0)
        # Cap the exponent before computing: factor ** 1000 overflows a float.
        raw = float(self.max if exponent > 64 else min(self.max, self.base * self.factor**exponent))
        if not self.jitter:
            return raw
        return random.uniform(raw / 2, raw)


def default_backoff() -> Backoff:
    """The global backoff from ``PGQUEUE['RETRY_BACKOFF_BASE']`` and ``RETRY_BACKOFF_MAX``."""
    settings = conf.get_settings()
    return Backoff(base=settings.RETRY_BACKOFF_BASE, max=settings.RETRY_BACKOFF_MAX)
