"""Held jobs: the due pending jobs of a key beyond its per-key limit, kept out of the
claim's sight until their key has room (``sql/key_limits_v1.sql``).

The insert paths hold every due job with a key and then release its key here, in the
same transaction; ``JobQuerySet.cancel()`` releases the keys of the jobs it cancelled.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from django.db import connections

_RELEASE_KEYS = "SELECT pgqueue_release_held_keys(%s::text[], %s::text[])"
_SWEEP = "SELECT pgqueue_release_held_jobs()"
_HELD_AMONG = "SELECT id FROM pgqueue_jobs WHERE id = ANY(%s) AND held"


def release_keys(using: str, keys: Iterable[tuple[str, str]]) -> int:
    """Release the held jobs of these ``(job_type, concurrency_key)`` keys that fit in
    their limits, in claim order; return how many were released."""
    distinct = sorted(set(keys))
    if not distinct:
        return 0
    with connections[using].cursor() as cursor:
        cursor.execute(
            _RELEASE_KEYS, [[job_type for job_type, _ in distinct], [key for _, key in distinct]]
        )
        (released,) = cursor.fetchone()
    return int(released)


def sweep(using: str) -> int:
    """Hold the excess of keys with more visible due jobs than their limit, then release
    the held jobs of every key with room (or no limit left); return how many were
    released. The SQL function ``pgqueue_release_held_jobs()``."""
    with connections[using].cursor() as cursor:
        cursor.execute(_SWEEP)
        (released,) = cursor.fetchone()
    return int(released)


def held_among(using: str, ids: list[uuid.UUID]) -> set[uuid.UUID]:
    """Which of the jobs ``ids`` are held now."""
    with connections[using].cursor() as cursor:
        cursor.execute(_HELD_AMONG, [ids])
        return {row[0] for row in cursor.fetchall()}
