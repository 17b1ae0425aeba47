"""Who holds back vacuum: the oldest open transaction or snapshot in the jobs database.

Every claimed and finished job leaves a dead row version behind, which vacuum removes
only once no transaction could still see it: once the database's *xmin horizon* has
moved past it. A session left ``idle in transaction`` after a write or a lock, a long
report in ``REPEATABLE READ``, or a forgotten prepared transaction holds the horizon
where it was when it began: dead job rows pile up, the claim's index walks over more
of them, and the queue slows down. PostgreSQL does not say who is to blame; this
module finds the holder, so that workers (their heartbeat), ``pgqueue_status`` and
the metrics can name it once it has held the horizon past
``PGQUEUE["HORIZON_WARNING_AFTER"]``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.db import connections

from . import conf

logger = logging.getLogger("django_pgqueue.worker")

# The backends of this database with a snapshot (backend_xmin) or a transaction id
# (backend_xid), and its prepared transactions; the one furthest behind, in
# transactions. Another role's sessions show a pid and times, but their state and query
# only to roles with pg_read_all_stats (pg_monitor).
_OLDEST = """
SELECT kind, age_seconds, xid_age, pid, state, username, application, query
  FROM (
    SELECT 'backend' AS kind,
           extract(epoch FROM now() - xact_start)::float8 AS age_seconds,
           greatest(age(backend_xmin), age(backend_xid)) AS xid_age,
           pid, coalesce(state, '') AS state, coalesce(usename, '') AS username,
           coalesce(application_name, '') AS application,
           left(coalesce(query, ''), 200) AS query
      FROM pg_stat_activity
     WHERE datname = current_database()
       AND pid <> pg_backend_pid()
       AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
    UNION ALL
    SELECT 'prepared transaction', extract(epoch FROM now() - prepared)::float8,
           age(transaction), NULL, 'prepared', owner::text, gid, ''
      FROM pg_prepared_xacts
     WHERE database = current_database()
  ) AS holders
 ORDER BY xid_age DESC, age_seconds DESC NULLS LAST
 LIMIT 1
"""


@dataclass(frozen=True)
class HorizonHolder:
    """The session or prepared transaction that holds the xmin horizon furthest back.

    Attributes:
        kind: ``"backend"`` or ``"prepared transaction"``.
        age_seconds: How long its transaction has been open (``None``: not known).
        xid_age: How many transactions the horizon is behind because of it.
        pid: The backend's process id (``None`` for a prepared transaction).
        state: ``"idle in transaction"``, ``"active"``, ...; ``"prepared"``.
        user: Its role.
        application: Its ``application_name`` (a prepared transaction's gid).
        query: The first 200 characters of its current or last query.
    """

    kind: str
    age_seconds: float | None
    xid_age: int
    pid: int | None
    state: str
    user: str
    application: str
    query: str

    def describe(self) -> str:
        """One line naming the holder, for logs and the status command."""
        age = "" if self.age_seconds is None else f" for {self.age_seconds:.0f}s"
        if self.kind == "prepared transaction":
            return f"prepared transaction {self.application!r} of {self.user!r}, open{age}"
        state = self.state or "state hidden: grant pg_read_all_stats to see it"
        who = f" ({self.application!r})" if self.application else ""
        return f"backend pid {self.pid} of {self.user!r}{who}, {state}{age}"

    def past_threshold(self) -> bool:
        """Whether it has held the horizon longer than HORIZON_WARNING_AFTER."""
        after = conf.get_settings().HORIZON_WARNING_AFTER
        return after is not None and self.age_seconds is not None and self.age_seconds > after


def oldest_holder(using: str | None = None) -> HorizonHolder | None:
    """The holder of the jobs database's xmin horizon furthest behind, if any."""
    with connections[conf.jobs_database(using)].cursor() as cursor:
        return read_holder(cursor)


def read_holder(cursor: Any) -> HorizonHolder | None:
    """``oldest_holder()`` on an open cursor (the read model's transaction)."""
    cursor.execute(_OLDEST)
    row = cursor.fetchone()
    return None if row is None else HorizonHolder(*row)


class HorizonWatch:
    """Warns, once per holder, when one holds the horizon past the threshold."""

    def __init__(self) -> None:
        self._warned: set[tuple[str, int | None, str]] = set()

    def check(self, using: str | None = None) -> HorizonHolder | None:
        """Read the oldest holder; log a warning the first time it is past the
        threshold. Returns it when it is past the threshold."""
        if conf.get_settings().HORIZON_WARNING_AFTER is None:
            return None
        holder = oldest_holder(using)
        if holder is None or not holder.past_threshold():
            return None
        key = (holder.kind, holder.pid, holder.application)
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(
                "vacuum cannot remove dead job rows: %s holds the xmin horizon %d "
                "transactions back (its query: %r). Claims slow down while it lasts; end "
                "it, and set idle_in_transaction_session_timeout",
                holder.describe(),
                holder.xid_age,
                holder.query,
                extra={"pgqueue_horizon_pid": holder.pid},
            )
        return holder
