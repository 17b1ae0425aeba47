"""The hand-back before a forced exit: one attempt, bounded in time, to give back the
jobs a worker holds, so that they need not wait ``STALE_AFTER`` for recovery.

A second SIGTERM/SIGINT must end the process at once, whatever the database does: the
attempt runs in a thread of its own that the exiting worker waits for at most
``HAND_BACK_SECONDS``, on a fresh connection (the worker's own may be in the middle of
a statement the signal interrupted) whose statements the server cancels before then.
What it cannot write is left to recovery.

Handlers still running cannot be stopped; the process exits right after, and FINISH
only writes jobs still held by this worker, so no later outcome of theirs can
overwrite a job handed back.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

import psycopg

from ..sideconn import open_raw_connection
from .adapters import adapt_worker_connection
from .execution import PENDING, Outcome, RunningJob, retry_or_fail

logger = logging.getLogger("django_pgqueue.worker")

#: What ``last_error`` of a job handed back says.
FORCED_EXIT_ERROR = "worker forced to exit"
#: Seconds before a job released while its handler still runs may run again: its
#: worker's process exits right after recording the release (``os._exit``), and the
#: handler's thread with it, well within them. A job whose handler never started is
#: due at once.
RELEASED_RUNNING_DELAY = 1.0
#: How long the exiting worker waits for the hand-back.
HAND_BACK_SECONDS = 1.0
#: The server cancels the hand-back's statements after this long (a row lock held
#: elsewhere, an overloaded server), before the worker stops waiting.
STATEMENT_TIMEOUT_MS = 700


def forced_exit_outcomes(held: Iterable[RunningJob], unflushed: Iterable[Outcome]) -> list[Outcome]:
    """What to write before a forced exit: the outcomes not recorded yet, each finished
    job's own outcome, and every other held job handed back.

    A job given back follows the rules of any failed attempt: ``pending``, due once its
    handler is certainly gone (``RELEASED_RUNNING_DELAY``), or ``failed`` once its
    attempts are spent. One whose handler never
    started (it waited in the prefetch buffer) gets its attempt back, as at a graceful
    shutdown.
    """
    # By claim: an outcome of an earlier claim of a job does not stand for a later one.
    outcomes = {(outcome.job_id, outcome.claimed_at): outcome for outcome in unflushed}
    for running in held:
        job_id, claimed_at = claim = running.job.id, running.job.claimed_at
        if claim in outcomes:
            continue
        if running.outcome is not None:  # finished, not yet taken by the main loop
            started = running.recorded_start()
            outcomes[claim] = dataclasses.replace(running.outcome, started=started)
        elif running.started_wall is None:
            outcomes[claim] = Outcome(
                job_id, PENDING, claimed_at, refund=1, error=FORCED_EXIT_ERROR, unstarted=True
            )
        else:
            outcomes[claim] = retry_or_fail(running, FORCED_EXIT_ERROR, "", RELEASED_RUNNING_DELAY)
    return list(outcomes.values())


def hand_back(alias: str, statement: str, params: list[Any]) -> int | None:
    """Run the FINISH ``statement`` on a fresh connection to ``alias``; return how many
    jobs it wrote, or None when it failed or did not end within ``HAND_BACK_SECONDS``."""
    written: list[int] = []
    attempt = threading.Thread(
        target=_write,
        args=(alias, statement, params, written),
        name="pgqueue-hand-back",
        daemon=True,  # never keeps the exiting process alive
    )
    deadline = time.monotonic() + HAND_BACK_SECONDS
    attempt.start()
    attempt.join(max(deadline - time.monotonic(), 0.0))
    if attempt.is_alive():
        logger.error("handing jobs back took longer than %.1fs: gave up", HAND_BACK_SECONDS)
        return None
    return written[0] if written else None


def _write(alias: str, statement: str, params: list[Any], written: list[int]) -> None:
    try:
        # connect_timeout: libpq's minimum (2 s); the caller stops waiting before that.
        with open_raw_connection(alias, connect_timeout=2) as conn:
            adapt_worker_connection(conn)  # the array dumpers of FINISH_COMPLETED
            # One round trip; SET LOCAL keeps the timeout off a pooled server connection.
            with conn.pipeline(), conn.transaction():
                conn.execute(f"SET LOCAL statement_timeout = {STATEMENT_TIMEOUT_MS}", prepare=False)
                cursor = psycopg.Cursor(conn).execute(statement, params, prepare=False)
            written.append(cursor.rowcount)
    except psycopg.Error as exc:
        logger.error("could not hand jobs back (%s: %s)", type(exc).__name__, str(exc).strip())
