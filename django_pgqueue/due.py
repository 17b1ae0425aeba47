"""What "due" means, stated once: a pending job whose ``run_at`` has come; and the
order in which due jobs are claimed.

``run_at`` is set by the database from its own clock (``now()`` plus any delay) unless
the caller gives one, so "due" is always decided by the server, never by the client's
clock. The claim (``sql/claim_job_batch_v*.sql``, where plpgsql cannot import it: a test
checks the installed function against it), the NOTIFY sent by every insert path, and the
queue statistics use these predicates; querysets use :func:`due_q` and
:func:`not_yet_due_q`, the same predicates in the ORM.
"""

from __future__ import annotations

from django.db.models import Q
from django.db.models.functions import Now

#: SQL predicate on ``pgqueue_jobs`` (or any relation with a ``run_at`` column): due now.
DUE = "run_at <= now()"

#: SQL predicate: scheduled for later (the complement of :data:`DUE`).
NOT_YET_DUE = f"NOT ({DUE})"


#: The order in which due jobs are claimed: highest priority first, then the one due
#: earliest, then the oldest. The claim walks ``idx_jobs_claimable`` in this order (its
#: leading columns, :data:`CLAIM_INDEX_FIELDS`), and the worker starts a claimed batch
#: in it; a test checks the installed function and index against it.
CLAIM_ORDER = "priority DESC, run_at, created_at"

#: :data:`CLAIM_ORDER` as the leading fields of a Django ``Index``.
CLAIM_INDEX_FIELDS = ("-priority", "run_at", "created_at")


def due_q() -> Q:
    """:data:`DUE` as an ORM filter, for querysets of ``Job``."""
    return Q(run_at__lte=Now())


def not_yet_due_q() -> Q:
    """:data:`NOT_YET_DUE` as an ORM filter, for querysets of ``Job``."""
    return Q(run_at__gt=Now())
