"""The plans PostgreSQL chose for the statements inside our SQL functions.

``EXPLAIN SELECT claim_job_batch(...)`` shows only a function call, so the plans are
captured with auto_explain, which reports the plan of every statement a function runs,
with its actual arguments, as a NOTICE sent to this client. Settings are ``SET LOCAL``:
the test's transaction ends them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction


def statement_plans(run: Callable[[], object], *, analyze: bool = False) -> list[dict[str, Any]]:
    """Call ``run`` and return the plan of each statement it ran, nested ones too (each
    with its ``Query Text``); with ``analyze``, with the rows each node read."""
    with connection.cursor() as cursor:
        try:
            with transaction.atomic():
                cursor.execute("LOAD 'auto_explain'")
        except DatabaseError as exc:  # not a superuser, or the module is not installed
            pytest.skip(f"auto_explain is unavailable on this server: {exc}")
        for setting, value in [
            ("log_min_duration", "0"),
            ("log_nested_statements", "on"),
            ("log_level", "notice"),
            ("log_format", "json"),
            ("log_analyze", "on" if analyze else "off"),
            ("log_timing", "off"),
        ]:
            cursor.execute(f"SET LOCAL auto_explain.{setting} = {value}")
        cursor.execute("SET LOCAL client_min_messages = notice")
    notices: list[str] = []
    handler = lambda diagnostic: notices.append(diagnostic.message_primary)  # noqa: E731
    connection.connection.add_notice_handler(handler)
    try:
        run()
    finally:
        connection.connection.remove_notice_handler(handler)
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL auto_explain.log_min_duration = -1")
    return [json.loads(text[text.index("{") :]) for text in notices if "plan:" in text]


def plan_nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    """``node`` and every node under it."""
    return [node, *(child for sub in node.get("Plans", []) for child in plan_nodes(sub))]


def scans_of(plan: dict[str, Any], table: str) -> list[tuple[str, str]]:
    """How ``plan`` reads ``table``: for each scan of it, the index it goes through
    ("seq scan" when none) and its conditions (index conditions and filters)."""
    scans = []
    for node in plan_nodes(plan["Plan"]):
        if node.get("Relation Name") != table:
            continue
        below = [sub for sub in plan_nodes(node) if sub["Node Type"] == "Bitmap Index Scan"]
        for scan in below or [node]:  # a bitmap heap scan's indexes are below it
            conditions = " AND ".join(
                str(scan.get(key) or node.get(key))
                for key in ("Index Cond", "Recheck Cond", "Filter")
                if scan.get(key) or node.get(key)
            )
            scans.append((scan.get("Index Name", "seq scan"), conditions))
    return scans
