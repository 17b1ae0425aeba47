"""Checks shared by ``enqueue``, ``enqueue_many`` and ``@job``: each raises
:class:`~django_pgqueue.exceptions.InvalidJobError` naming the field.

What passes is what PostgreSQL stores and Python reads back unchanged: a value that
would be altered on the way (a float that jsonb turns into an integer, a dict key that
JSON turns into a string) or that could not be read back (a time outside Python's
range in UTC, JSON nested too deep to decode) is refused here, before anything is
written. The checks read no settings: limits are passed in.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from . import schema
from .exceptions import InvalidArgumentError, InvalidJobError

_JOB_TYPE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:/\-]*$")
_QUEUE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:\-]*$")
# An escaped NUL in JSON text: "\u0000" preceded by an even number of backslashes.
_JSON_NUL_RE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
#: How deeply ``data`` may nest (dicts and lists within each other). JSON's C encoder
#: and decoder recurse per level and stop at Python's recursion limit, in the enqueuing
#: process and in the worker that decodes the job; this keeps both far from it.
MAX_NESTING = 100

# Python writes floats of this magnitude or more in exponent form ("1e+16"), which jsonb
# stores as an exact numeric and returns without a fraction: they come back as ints.
_FLOAT_LIMIT = 1e16
# Python refuses to write (and read) integers of more digits than this by default.
_INT_LIMIT = 10**4300

#: The earliest and latest times accepted, in UTC: a day inside Python's range, so that
#: the time can be shown in any time zone (offsets are less than a day).
EARLIEST_TIME = datetime(1, 1, 2, tzinfo=UTC)
LATEST_TIME = datetime(9999, 12, 30, 23, 59, 59, 999999, tzinfo=UTC)

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
    name = _check_name(field, value, pattern, max_length, what)
    if len(known) >= _VALID_NAMES_KEPT:
        known.clear()
    known.add(name)
    return name


def _check_name(
    field: str, value: Any, pattern: re.Pattern[str], max_length: int, what: str
) -> str:
    """``value`` if it is a valid name; ``InvalidJobError`` otherwise."""
    if not isinstance(value, str):
        raise InvalidJobError(field, f"must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidJobError(field, "must not be empty")
    if len(value) > max_length:
        raise InvalidJobError(field, f"must be at most {max_length} characters, got {len(value)}")
    # fullmatch: with match(), "$" also matches before a trailing newline.
    if not pattern.fullmatch(value):
        raise InvalidJobError(field, f"{value!r} is not a valid {what}; use {pattern.pattern}")
    return value


def job_type(value: Any, field: str = "job_type") -> str:
    """A job type: letters, digits and ``_ . : / -``, e.g. ``"emails.send_welcome"``."""
    return _name(field, value, _JOB_TYPE_RE, schema.JOB_TYPE_MAX_LENGTH, "job type")


def queue(value: Any, field: str = "queue") -> str:
    """A queue name: letters, digits and ``_ . : -``, e.g. ``"emails"``."""
    return _name(field, value, _QUEUE_RE, schema.QUEUE_MAX_LENGTH, "queue name")


def unique_key(value: Any, field: str = "unique_key") -> str:
    """A unique key: any text of 1 to ``UNIQUE_KEY_MAX_LENGTH`` characters, no NUL."""
    return _key(value, field, schema.UNIQUE_KEY_MAX_LENGTH, "; pass None for no key")


def step_name(value: Any, field: str = "name") -> str:
    """The name of a durable step: text of 1 to ``STEP_NAME_MAX_LENGTH`` characters, no
    NUL."""
    return _key(value, field, schema.STEP_NAME_MAX_LENGTH, "")


def event_name(value: Any, field: str = "name") -> str:
    """The name of an event (``emit_event()``, ``job.wait_for_event()``): text of 1 to
    ``EVENT_NAME_MAX_LENGTH`` characters, no NUL."""
    return _key(value, field, schema.EVENT_NAME_MAX_LENGTH, "")


def concurrency_key(value: Any, field: str = "concurrency_key") -> str:
    """A key of a per-key concurrency limit: text of 1 to ``CONCURRENCY_KEY_MAX_LENGTH``
    characters, no NUL."""
    return _key(value, field, schema.CONCURRENCY_KEY_MAX_LENGTH, "")


def _key(value: Any, field: str, max_length: int, empty_hint: str) -> str:
    if not isinstance(value, str):
        raise InvalidJobError(field, f"must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidJobError(field, f"must not be empty{empty_hint}")
    if len(value) > max_length:
        raise InvalidJobError(
            field,
            f"must be at most {max_length} characters, got {len(value)}; "
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
    if not schema.PRIORITY_MIN <= value <= schema.PRIORITY_MAX:
        raise InvalidJobError(
            field,
            f"must be between {schema.PRIORITY_MIN} and {schema.PRIORITY_MAX} "
            f"(higher runs first), got {value}",
        )
    return value


def max_attempts(value: Any, field: str = "max_attempts") -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidJobError(field, f"must be an integer, got {value!r}")
    if not 1 <= value <= schema.MAX_ATTEMPTS_LIMIT:
        raise InvalidJobError(
            field, f"must be between 1 and {schema.MAX_ATTEMPTS_LIMIT}, got {value}"
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


def delay(value: Any, field: str) -> float:
    """A ``delay``: a duration from 0 to 1,000 years (``schema.MAX_DELAY_SECONDS``)."""
    return _at_most_1000_years(seconds(value, field), value, field)


def unique_window(value: Any, field: str) -> float:
    """A ``unique_for`` window: a positive duration of at most 1,000 years."""
    return _at_most_1000_years(seconds(value, field, allow_zero=False), value, field)


def _at_most_1000_years(result: float, value: Any, field: str) -> float:
    if result > schema.MAX_DELAY_SECONDS:
        most = f"{schema.MAX_DELAY_SECONDS:.0f}"
        raise InvalidJobError(field, f"must be at most 1,000 years ({most} seconds), got {value!r}")
    return result


def aware_datetime(value: Any, field: str) -> datetime:
    """``value``, a timezone-aware datetime, in UTC: what PostgreSQL stores and returns.

    Converted here because PostgreSQL refuses offsets that Python allows (beyond 15:59
    hours, or with seconds or microseconds).
    """
    if not isinstance(value, datetime):
        raise InvalidJobError(field, f"must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidJobError(
            field,
            "must be timezone-aware (a naive datetime is ambiguous); "
            "use django.utils.timezone.now() + timedelta(...) or datetime(..., tzinfo=UTC)",
        )
    try:
        in_utc = value.astimezone(UTC)
    except OverflowError:
        in_utc = None
    if in_utc is None or not EARLIEST_TIME <= in_utc <= LATEST_TIME:
        raise InvalidJobError(
            field,
            f"{value.isoformat()} is outside the supported range once converted to UTC "
            f"({EARLIEST_TIME:%Y-%m-%d} to {LATEST_TIME:%Y-%m-%d}): Python cannot read "
            "such a time back from the database",
        )
    return in_utc


class _Unstorable(Exception):
    """A part of a payload that cannot round-trip; ``path`` is filled in on the way out."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.path: list[str] = []


def _check_float(value: float) -> None:
    if -_FLOAT_LIMIT < value < _FLOAT_LIMIT:
        return
    if not math.isfinite(value):
        raise _Unstorable(f"is {value!r}, not a JSON number; store it as a string or None")
    raise _Unstorable(
        f"is the float {value!r}, which would come back as an integer (PostgreSQL's jsonb "
        "keeps no exponent); pass it as an int or a string"
    )


def _check_tree(value: Any, depth: int) -> None:
    """Raise ``_Unstorable`` for a part of ``value`` that JSON in jsonb would not keep.

    Types JSON cannot encode at all are left to the encoder, which names them.
    """
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return
    if kind is int:
        if -_INT_LIMIT < value < _INT_LIMIT:
            return
        raise _Unstorable("is an integer of more than 4,300 digits; store it as a string")
    if kind is float:
        _check_float(value)
        return
    if kind is dict or kind is list or kind is tuple:
        if depth >= MAX_NESTING:
            raise _Unstorable(
                f"nests more than {MAX_NESTING} levels deep; flatten it or store it elsewhere"
            )
        if kind is dict:
            for key, item in value.items():
                if type(key) is not str and not isinstance(key, str):
                    raise _Unstorable(
                        f"has the key {key!r} ({type(key).__name__}); JSON keys are strings, "
                        "so it would come back as a string: convert it first"
                    )
                try:
                    _check_tree(item, depth + 1)
                except _Unstorable as exc:
                    exc.path.append(f"[{key!r}]")
                    raise
        else:
            for index, item in enumerate(value):
                try:
                    _check_tree(item, depth + 1)
                except _Unstorable as exc:
                    exc.path.append(f"[{index}]")
                    raise
        return
    # Subclasses (IntEnum, StrEnum, OrderedDict...): checked as their base type.
    base: type[Any]
    for base in (bool, int, float, str, dict, list, tuple):
        if isinstance(value, base):
            _check_tree(base(value), depth)
            return


def payload(value: Any, field: str = "data", *, max_bytes: int) -> str:
    """Serialise ``value`` (a dict) to compact JSON of at most ``max_bytes`` bytes.

    Refuses values that would not come back unchanged: NaN and infinities, floats of
    1e16 and more, integers of more than 4,300 digits, keys that are not strings,
    nesting deeper than :data:`MAX_NESTING`, NUL characters and lone surrogates.
    """
    if value is None:
        return "{}"
    if not isinstance(value, dict):
        raise InvalidJobError(field, f"must be a dict (a JSON object), got {type(value).__name__}")
    return json_value(value, field, max_bytes=max_bytes)


def json_value(value: Any, field: str, *, max_bytes: int) -> str:
    """Serialise any JSON value (a step's result) as :func:`payload` does a payload, with
    its checks and its limit of ``max_bytes``."""
    try:
        _check_tree(value, 0)
    except _Unstorable as exc:
        where = "".join(reversed(exc.path))
        raise InvalidJobError(
            field, f"{field}{where} {exc.reason}" if where else exc.reason
        ) from None
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
    if size > max_bytes:
        raise InvalidJobError(
            field,
            f"is {size} bytes of JSON, over the limit of {max_bytes} "
            "(PGQUEUE['MAX_PAYLOAD_BYTES']); store large content elsewhere and pass a reference",
        )
    return text


def names(
    values: Iterable[str] | None,
    check: Callable[[Any, str], str],
    field: str,
    error: type[InvalidArgumentError] = InvalidJobError,
) -> list[str] | None:
    """A filter of names (queues, job types): ``None`` for any, one name or several,
    each passed through ``check``; an empty one raises ``error``."""
    if values is None:
        return None
    if isinstance(values, str):
        values = [values]
    checked = [check(value, field) for value in values]
    if not checked:
        raise error(field, "must name at least one, or be None for any")
    return checked
