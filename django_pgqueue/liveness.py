"""Which workers are live, and which one leads, stated once.

A worker is live while it has not stopped and its last heartbeat is younger than
``PGQUEUE["STALE_AFTER"]``, by the database's clock. The live worker with the lowest id
leads: it alone recovers, prunes, writes the rollups, enqueues periodic jobs and wakes
idle workers (worker/heartbeat.py, worker/listener.py). Each heartbeat asks whether its
worker leads (worker/queries.py ``WORKER_BEAT``), and the admin, ``pgqueue_status`` and
the metrics read the workers' states from the same SQL (stats.py).
"""

from __future__ import annotations

#: SQL predicate on a row of ``pgqueue_workers``: the worker is live. Its parameter
#: ``%(stale_after)s`` is ``STALE_AFTER`` in seconds.
LIVE = "stopped_at IS NULL AND heartbeat_at > now() - %(stale_after)s * interval '1 second'"

#: SQL expression: the id of the worker that leads (NULL while none is live).
LEADER = f"(SELECT min(worker_id) FROM pgqueue_workers WHERE {LIVE})"
