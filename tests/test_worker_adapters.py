"""The psycopg adapters of the worker's own connection (``worker/adapters.py``), on a
real connection: they must read and write exactly what psycopg's own adapters do."""

import json
import uuid

import psycopg
import pytest

from django_pgqueue.sideconn import open_raw_connection
from django_pgqueue.worker.adapters import (
    Float8Array,
    JsonbBinaryLoader,
    UUIDArray,
    adapt_worker_connection,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def worker_conn():
    conn = open_raw_connection("default")
    adapt_worker_connection(conn)
    yield conn
    conn.close()


def select_binary(conn, sql, params):
    cursor = psycopg.Cursor(conn)
    cursor.execute(sql, params, binary=True)
    return cursor.fetchone()[0]


JSON_VALUES = [
    {"i": 1},
    {},
    [],
    ["host:1:abc", "host:2:def"],
    "123",  # a JSON string of digits stays a string
    "",
    1.5,
    -7,
    True,
    None,  # JSON null
    {"é": "ü €", "nested": {"list": [1, 2.25, None, "x"]}, "emoji": "🙂"},
    {"long": "x" * 100_000},
]


@pytest.mark.parametrize("value", JSON_VALUES, ids=repr)
def test_jsonb_is_read_as_psycopgs_own_loader_reads_it(worker_conn, value):
    text = json.dumps(value)
    ours = select_binary(worker_conn, "SELECT %s::jsonb", [text])
    with psycopg.connect(**_params()) as plain:
        theirs = select_binary(plain, "SELECT %s::jsonb", [text])
    assert ours == theirs == value
    assert type(ours) is type(value)


def _params():
    from django.db import connection

    return connection.get_connection_params() | {"cursor_factory": psycopg.Cursor}


def test_jsonb_loader_falls_back_to_json_loads_and_rejects_what_is_not_jsonb(worker_conn):
    loader = JsonbBinaryLoader(0, worker_conn)
    assert loader.load(b'\x01 {"a": 1} \n') == {"a": 1}
    with pytest.raises(json.JSONDecodeError):
        loader.load(b'\x01{"a": ')
    with pytest.raises(json.JSONDecodeError):
        loader.load(b"\x01[1] [2]")
    with pytest.raises(psycopg.DataError, match="unknown jsonb binary format"):
        loader.load(b"\x02{}")


@pytest.mark.parametrize("count", [0, 1, 3, 500])
def test_uuid_and_float_arrays_arrive_as_sent(worker_conn, count):
    ids = [uuid.uuid4() for _ in range(count)]
    times = [1_764_000_000.123456 + n / 7 for n in range(count)]
    assert select_binary(worker_conn, "SELECT %b", [UUIDArray(ids)]) == ids
    assert select_binary(worker_conn, "SELECT pg_typeof(%b)::text", [UUIDArray(ids)]) == "uuid[]"
    assert select_binary(worker_conn, "SELECT %b", [Float8Array(times)]) == times
    assert (
        select_binary(worker_conn, "SELECT pg_typeof(%b)::text", [Float8Array(times)])
        == "double precision[]"
    )
