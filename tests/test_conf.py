"""The PGQUEUE setting: defaults, validation with messages that name the key, caching."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings

from django_pgqueue import conf
from django_pgqueue.conf import PgQueueSettings
from django_pgqueue.exceptions import PgQueueError, SettingsError

# A valid baseline: tests below change one key at a time.
VALID = {"HEARTBEAT_INTERVAL": 10, "STALE_AFTER": 60}


def settings_from(**values):
    with override_settings(PGQUEUE={**VALID, **values}):
        return conf.get_settings()


def test_without_pgqueue_every_default_applies(settings):
    del settings.PGQUEUE
    # Deleting a setting sends no setting_changed signal (Django only sends it on
    # override), so the cached value must be dropped by hand here.
    conf.get_settings.cache_clear()

    assert conf.get_settings() == PgQueueSettings()
    assert conf.get_settings().DATABASE == "default"
    assert conf.get_settings().MAX_PAYLOAD_BYTES == 65536


@pytest.mark.parametrize(
    ("value", "expected"),
    [(5, 5.0), (2.5, 2.5), (timedelta(minutes=2), 120.0), (timedelta(milliseconds=250), 0.25)],
)
def test_durations_accept_seconds_or_a_timedelta(value, expected):
    backoff_max = settings_from(RETRY_BACKOFF_MAX=value).RETRY_BACKOFF_MAX
    poll_interval = settings_from(POLL_INTERVAL=value).POLL_INTERVAL

    assert (backoff_max, poll_interval) == (expected, expected)


@pytest.mark.parametrize("key", ["POLL_INTERVAL", "HEARTBEAT_INTERVAL", "RECOVER_INTERVAL"])
def test_durations_that_pace_worker_loops_must_not_be_zero(key):
    with pytest.raises(SettingsError, match=rf"PGQUEUE\['{key}'\] must be a positive duration"):
        settings_from(**{key: 0})


@pytest.mark.parametrize("key", ["SHUTDOWN_GRACE", "RETRY_BACKOFF_BASE", "RETRY_BACKOFF_MAX"])
def test_grace_and_backoff_may_be_zero(key):
    assert getattr(settings_from(**{key: 0}), key) == 0.0


@pytest.mark.parametrize(
    "value",
    ["10", None, True, -1, timedelta(seconds=-1), float("nan"), float("inf")],
    ids=["str", "none", "bool", "negative", "negative-timedelta", "nan", "infinite"],
)
def test_invalid_durations_are_rejected_naming_the_key(value):
    with pytest.raises(SettingsError, match=r"PGQUEUE\['SHUTDOWN_GRACE'\]"):
        settings_from(SHUTDOWN_GRACE=value)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("NOTIFY", "yes"),
        ("VALIDATE_JOB_TYPES", 1),
        ("DEFAULT_PRIORITY", "100"),
        ("DEFAULT_PRIORITY", True),
        ("DEFAULT_PRIORITY", 1001),
        ("DEFAULT_PRIORITY", -1),
        ("DEFAULT_MAX_ATTEMPTS", 0),
        ("DEFAULT_MAX_ATTEMPTS", 2.0),
        ("MAX_SNOOZES", -1),
        ("MAX_SNOOZES", 1_000_001),
        ("MAX_SNOOZES", 1.5),
        ("MAX_SNOOZES", True),
        ("MAX_PAYLOAD_BYTES", 1),
        ("MAX_PAYLOAD_BYTES", "64k"),
        ("DATABASE", ""),
        ("DATABASE", None),
        ("DEFAULT_QUEUE", 5),
        ("DEFAULT_QUEUE", "has space"),
        ("NOTIFY_CHANNEL", "Jobs-Channel"),
        ("NOTIFY_CHANNEL", "jobs; DROP TABLE pgqueue_jobs"),
        ("NOTIFY_CHANNEL", "x" * 64),
    ],
)
def test_values_of_the_wrong_type_or_range_are_rejected_naming_the_key(key, value):
    with pytest.raises(SettingsError, match=rf"PGQUEUE\['{key}'\]"):
        settings_from(**{key: value})


@pytest.mark.parametrize(("heartbeat", "stale"), [(60, 60), (61, 60), (timedelta(minutes=2), 60)])
def test_heartbeat_interval_must_be_shorter_than_stale_after(heartbeat, stale):
    with pytest.raises(SettingsError, match="must be shorter than"):
        settings_from(HEARTBEAT_INTERVAL=heartbeat, STALE_AFTER=stale)


def test_unknown_keys_are_rejected_and_listed_with_the_valid_ones():
    with pytest.raises(SettingsError) as excinfo:
        settings_from(MAX_RETRIES=3, TIMEOUT=5)

    assert "['MAX_RETRIES', 'TIMEOUT']" in str(excinfo.value)
    assert "STALE_AFTER" in str(excinfo.value)


def test_pgqueue_must_be_a_dict():
    with override_settings(PGQUEUE=[("NOTIFY", False)]), pytest.raises(SettingsError, match="dict"):
        conf.get_settings()


def test_settings_errors_are_pgqueue_errors():
    assert issubclass(SettingsError, PgQueueError)


def test_settings_are_read_once_and_cached():
    assert conf.get_settings() is conf.get_settings()


def test_override_settings_takes_effect_at_once_and_is_undone_after():
    original = conf.get_settings()

    with override_settings(PGQUEUE={**VALID, "DEFAULT_PRIORITY": 7}):
        assert conf.get_settings().DEFAULT_PRIORITY == 7
        with override_settings(PGQUEUE={**VALID, "DEFAULT_PRIORITY": 8}):
            assert conf.get_settings().DEFAULT_PRIORITY == 8
        assert conf.get_settings().DEFAULT_PRIORITY == 7

    assert conf.get_settings() == original
