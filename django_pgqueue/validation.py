"""Checks shared by ``enqueue``, ``enqueue_many`` and ``@job``: each raises
:class:`~django_pgqueue.exceptions.InvalidJobError` naming the field."""

from __future__ import annotations

import json
import math
import re
from datetime import datetime, timedelta
from typing import Any

from . import conf
from .exceptions import InvalidJobError

_JOB_TYPE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:/\-]*$")
_QUEUE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:\-]*$")
# An escaped NUL in JSON text: "\u0000" preceded by an even number of backslashes.
_JSON_NUL_RE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
# One encoder for every payload: json.dumps builds a new one per call when given options.
_PAYLOAD_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


#: Names that passed ``_name`` already, by pattern: a job type or queue is validated once,
#: not on every enqueue. Bounded, so that unbounded distinct names cannot grow it forever.
_VALID_NAMES: dict[str, set[str]] = {_JOB_TYPE_RE.pattern: set(), _QUEUE_RE.pattern: set()}
_VALID_NAMES_KEPT = 10_000


def _name(field: str, value: Any, pattern: re.Pattern[str], max_length: int, what: str) -> str:
    known = _VALID_NAMES[pattern.pattern]
    if type(value) is str and value in known:
        return value
    _check_name(field, value, pattern, max_length, what)
    if len(known) >= _VALID_NAMES_KEPT:
        known.clear()
    known.add(value)
    return value


def _check_name(
    field: str, value: Any, pattern: re.Pattern[str], max_length: int, what: str
) -> None:
    if not isinstance(value, str):
        raise InvalidJobError(field, f"must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidJobError(field, "must not be empty")
    if len(value) > max_length:
        raise InvalidJobError(field, f"must be at most {max_length} characters, got {len(value)}")
    # fullmatch: with match(), "$" also matches before a trailing newline.
    if not pattern.fullmatch(value):
        raise InvalidJobError(field, f"{value!r} is not a valid {what}; use {pattern.pattern}")


def job_type(value: Any, field: str = "job_type") -> str:
    """A job type: letters, digits and ``_ . : / -``, e.g. ``"emails.send_welcome"``."""
    return _name(field, value, _JOB_TYPE_RE, conf.JOB_TYPE_MAX_LENGTH, "job type")


def queue(value: Any, field: str = "queue") -> str:
    """A queue name: letters, digits and ``_ . : -``, e.g. ``"emails"``."""
    return _name(field, value, _QUEUE_RE, conf.QUEUE_MAX_LENGTH, "queue name")


def unique_key(value: Any, field: str = "unique_key") -> str:
    """A unique key: any text of 1 to ``UNIQUE_KEY_MAX_LENGTH`` characters, no NUL."""
    if not isinstance(value, str):
        raise InvalidJobError(field, f"must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidJobError(field, "must not be empty; pass None for no key")
    if len(value) > conf.UNIQUE_KEY_MAX_LENGTH:
        raise InvalidJobError(
            field,
            f"must be at most {conf.UNIQUE_KEY_MAX_LENGTH} characters, got {len(value)}; "
            "hash long parts of the key (e.g. hashlib.sha256(...).hexdigest())",
        )
    if "\x00" in value:
        raise InvalidJobError(field, "must not contain NUL characters (PostgreSQL rejects them)")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise InvalidJobError(
            field, "must be valid Unicode text (it contains a lone surrogate such as '\\ud800')"
        ) from None
    return value


def priority(value: Any, field: str = "priority") -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidJobError(field, f"must be an integer, got {value!r}")
    if not conf.PRIORITY_MIN <= value <= conf.PRIORITY_MAX:
        raise InvalidJobError(
            field,
            f"must be between {conf.PRIORITY_MIN} and {conf.PRIORITY_MAX} "
            f"(higher runs first), got {value}",
        )
    return value


def max_attempts(value: Any, field: str = "max_attempts") -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidJobError(field, f"must be an integer, got {value!r}")
    if not 1 <= value <= conf.MAX_ATTEMPTS_LIMIT:
        raise InvalidJobError(
            field, f"must be between 1 and {conf.MAX_ATTEMPTS_LIMIT}, got {value}"
        )
    return value


def seconds(value: Any, field: str, *, allow_zero: bool = True) -> float:
    """A non-negative duration given as seconds or a ``timedelta``."""
    if isinstance(value, timedelta):
        result = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        result = float(value)
    else:
        raise InvalidJobError(
            field, f"must be a timedelta or a number of seconds, got {type(value).__name__}"
        )
    if not math.isfinite(result) or result < 0 or (result == 0 and not allow_zero):
        raise InvalidJobError(field, f"must be a positive duration, got {value!r}")
    return result


def aware_datetime(value: Any, field: str) -> datetime:
    if not isinstance(value, datetime):
        raise InvalidJobError(field, f"must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidJobError(
            field,
            "must be timezone-aware (a naive datetime is ambiguous); "
            "use django.utils.timezone.now() + timedelta(...) or datetime(..., tzinfo=UTC)",
        )
    return value


def payload(value: Any, field: str = "data") -> str:
    """Serialise ``value`` (a dict) to compact JSON within ``MAX_PAYLOAD_BYTES``."""
    if value is None:
        return "{}"
    if not isinstance(value, dict):
        raise InvalidJobError(field, f"must be a dict (a JSON object), got {type(value).__name__}")
    try:
        text = _PAYLOAD_ENCODER.encode(value)
    except (TypeError, ValueError) as exc:
        raise InvalidJobError(
            field,
            f"must be JSON-serialisable ({exc}); pass ids and plain values, "
            "not model instances or files",
        ) from None
    if "\\u0000" in text and _JSON_NUL_RE.search(text):
        raise InvalidJobError(field, "must not contain NUL characters (PostgreSQL rejects them)")
    try:
        # ASCII text (a flag on the str, not a scan) is as many bytes as characters.
        size = len(text) if text.isascii() else len(text.encode())
    except UnicodeEncodeError:
        raise InvalidJobError(
            field, "must be valid Unicode text (it contains a lone surrogate such as '\\ud800')"
        ) from None
    limit = conf.get_settings().MAX_PAYLOAD_BYTES
    if size > limit:
        raise InvalidJobError(
            field,
            f"is {size} bytes of JSON, over the limit of {limit} "
            "(PGQUEUE['MAX_PAYLOAD_BYTES']); store large content elsewhere and pass a reference",
        )
    return text
