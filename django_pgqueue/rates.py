"""Rates: "at most N jobs per period", as written in ``@job(rate_limit=...)``, settings
and overrides, parsed into a :class:`Rate`.

A rate is written ``"<jobs>/<period>"``: ``"100/m"``, ``"10/s"``, ``"5000/h"``,
``"20/d"``, or with a count of units, ``"30/10s"``, ``"100/15 minutes"``. Units: ``s``,
``sec``, ``second``; ``m``, ``min``, ``minute``; ``h``, ``hour``; ``d``, ``day`` (plurals
accepted). Jobs: an integer from 1 to ``RATE_JOBS_MAX``; period: from 1 second to
``RATE_PERIOD_MAX_SECONDS``.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from .exceptions import InvalidArgumentError

__all__ = ["RATE_JOBS_MAX", "RATE_PERIOD_MAX_SECONDS", "Rate", "parse_rate"]

RATE_JOBS_MAX = 1_000_000
"""Most jobs a rate allows in its period."""
RATE_PERIOD_MAX_SECONDS = 7 * 86_400
"""Longest period of a rate, a week: the claim keeps a window's start times this long."""

_UNIT_SECONDS = {
    "s": 1,
    "sec": 1,
    "second": 1,
    "m": 60,
    "min": 60,
    "minute": 60,
    "h": 3600,
    "hour": 3600,
    "d": 86_400,
    "day": 86_400,
}
_RATE_RE = re.compile(r"^\s*(\d+)\s*/\s*(\d*)\s*([a-z]+)\s*$")


class Rate(NamedTuple):
    """At most ``jobs`` started in any ``seconds``-long window. ``str()`` writes it back
    as ``"100/m"``."""

    jobs: int
    """Most jobs in a window."""
    seconds: int
    """The window's length in seconds."""

    @classmethod
    def from_columns(cls, jobs: int | None, seconds: int | None) -> Rate | None:
        """The rate stored as a pair of columns (jobs, seconds), or ``None`` when unset."""
        return None if jobs is None or seconds is None else cls(jobs, seconds)

    def __str__(self) -> str:
        for unit, seconds in (("d", 86_400), ("h", 3600), ("m", 60), ("s", 1)):
            if self.seconds == seconds:
                return f"{self.jobs}/{unit}"
        return f"{self.jobs}/{self.seconds}s"


def parse_rate(value: Any, field: str) -> Rate:
    """``value`` (a rate string) as a :class:`Rate`.

    Raises:
        InvalidArgumentError: naming ``field``, for anything but a well-formed rate within
            the bounds.
    """
    if isinstance(value, Rate):
        return _bounded(value, field)
    if not isinstance(value, str):
        raise InvalidArgumentError(
            field, f'must be a rate such as "100/m" or "10/s", got {type(value).__name__}'
        )
    match = _RATE_RE.match(value.lower())
    unit = match and _unit_seconds(match[3])
    if match is None or unit is None:
        raise InvalidArgumentError(
            field,
            f'must be a rate such as "100/m", "10/s", "5000/h" or "30/10s" (units: s, m, h, '
            f"d), got {value!r}",
        )
    count = int(match[2]) if match[2] else 1
    return _bounded(Rate(int(match[1]), count * unit), field)


def _unit_seconds(word: str) -> int | None:
    """Seconds of a unit, singular or plural ("minutes"; never "ms" for minutes)."""
    if word in _UNIT_SECONDS:
        return _UNIT_SECONDS[word]
    singular = word.removesuffix("s")
    return _UNIT_SECONDS[singular] if len(singular) > 1 and singular in _UNIT_SECONDS else None


def _bounded(rate: Rate, field: str) -> Rate:
    if not 1 <= rate.jobs <= RATE_JOBS_MAX:
        raise InvalidArgumentError(
            field, f"allows from 1 to {RATE_JOBS_MAX} jobs per period, got {rate.jobs}"
        )
    if not 1 <= rate.seconds <= RATE_PERIOD_MAX_SECONDS:
        raise InvalidArgumentError(
            field,
            f"must have a period from 1 second to 7 days, got {rate.seconds} second(s)",
        )
    return rate
