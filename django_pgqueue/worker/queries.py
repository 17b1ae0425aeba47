"""Every statement the worker runs, in one place, each guarded by ``worker_id`` so a
worker can only change jobs it still holds (recovery may have taken a job back)."""

from __future__ import annotations

from ..due import CLAIM_ORDER, DUE
from ..liveness import LEADER
from ..schema import IN_FLIGHT, JobStatus, literal, status_in

_COMPLETED = literal(JobStatus.COMPLETED)
_PENDING = literal(JobStatus.PENDING)
_HELD = status_in(IN_FLIGHT, "jobs.status")

# Straight into 'running' (p_start): the jobs go to the slots in this transaction, a
# free slot starting each at once or, prefetched, as soon as one frees up; FINISH then
# records when a prefetched one actually started. The last two parameters: the number
# of free slots, and how soon the worker starts every job of the batch (NULL: it does
# not say, and a batch with jobs under a rate limit is no larger than the free slots).
# A job under a rate limit comes back with started_at later than claimed_at when it
# was counted as started at that later moment: it must start by then.
# Sorted by the server, in the order the slots should start them.
CLAIM = f"SELECT * FROM claim_job_batch(%s, %s, %s, %s, true, %s, %s, %s) ORDER BY {CLAIM_ORDER}"

# After a claim: seconds until a full rate limit of these job types and queues has room
# (NULL: none is full), so that the worker claims then rather than at its next poll.
RATE_LIMIT_WAIT = "SELECT pgqueue_rate_limit_wait(%s, %s)"

# Whether a due job of these job types and queues is under a rate limit: a burst worker
# whose claim came back empty waits for their window instead of exiting.
RATE_LIMITED_DUE = f"""
SELECT EXISTS (
    SELECT 1
      FROM pgqueue_jobs AS j
      JOIN pgqueue_rate_limits AS r
        ON CASE r.scope WHEN 'queue' THEN j.queue ELSE j.job_type END = r.name
       AND (r.scope <> 'key' OR j.concurrency_key IS NOT NULL)
     WHERE j.status = {_PENDING} AND NOT j.held AND j.{DUE}
       AND (%(job_types)s::text[] IS NULL OR j.job_type = ANY (%(job_types)s))
       AND (%(queues)s::text[] IS NULL OR j.queue = ANY (%(queues)s))
       AND j.queue NOT IN (SELECT name FROM pgqueue_queues WHERE paused_at IS NOT NULL))
"""

# Before FINISH sets them pending again: the room that jobs handed back unstarted held in
# their rate limits' windows (sql/rate_hand_back_v1.sql).
RATE_HAND_BACK = "SELECT pgqueue_rate_hand_back(%s::uuid[], %s)"

# Whether any rate limit exists: only then does a worker ask RATE_LIMIT_WAIT.
RATE_LIMITED = "SELECT EXISTS (SELECT 1 FROM pgqueue_rate_limits)"


# One statement finishes a whole batch of outcomes: completions, retries, failures and
# cancellations alike. A job retried goes back to pending with no worker; a finished
# one keeps the worker that ran it, for the record. An outcome is written only while
# the claim it ends holds the job (the worker's id and the claim's claimed_at): recovery
# may have taken the job back meanwhile and the same worker claimed it again, and the
# earlier run's outcome must not end the later one. The arrays go in binary (%b):
# psycopg dumps lists of UUIDs and floats two to three times faster in binary than in text.
# Moments are the transaction's (now()) in the worker's batches, which claim in the same
# transaction: a job made due at now() (a woken wait, a workflow's next job) is due to
# that claim. An atomic handler's completion is written in the handler's own transaction
# (execution.record_in_transaction()), begun at its first query: there they are the
# statement's (statement_timestamp()), FINISH_IN_TRANSACTION and its kin.
# started_ago: how many seconds before the statement a prefetched job's handler started,
# by the worker's monotonic clock, so that started_at is on the database's clock like
# every other moment: taken from the same moment as completed_at (never after
# it), and never before the claim (NULL: keep the claim's started_at); NaN for a job
# handed back unstarted, which then has no start time at all (read back, a start time
# that never happened would count against its rate limit's window).
# An attempt that ended without completing its job (all but those handed back unstarted)
# is recorded in pgqueue_job_attempts by the same statement; a retried or snoozed job
# starts its next attempt with no progress or stage of this one. A suspended job (a
# sleep, a wait for an event: ``suspended``) is due after its delay, or at once when an
# emitted event woke it while it ran (pgqueue_emit_event() then moved its run_at past
# its claimed_at; a claim always leaves run_at at or before claimed_at).
def _finish(moment: str) -> str:
    return f"""
WITH finished AS (
UPDATE pgqueue_jobs AS jobs
   SET status = o.status,
       progress = CASE o.status WHEN {_COMPLETED} THEN 100 WHEN {_PENDING} THEN 0
                                ELSE jobs.progress END,
       current_stage = CASE WHEN o.status = {_PENDING} THEN '' ELSE jobs.current_stage END,
       completed_at = CASE WHEN o.status = {_PENDING} THEN NULL ELSE {moment} END,
       run_at = CASE WHEN o.status <> {_PENDING} THEN jobs.run_at
                     WHEN o.suspended > 0 AND jobs.run_at > jobs.claimed_at THEN {moment}
                     ELSE {moment} + o.delay * interval '1 second' END,
       worker_id = CASE WHEN o.status = {_PENDING} THEN NULL ELSE jobs.worker_id END,
       attempts = jobs.attempts - o.refund,
       snoozes = jobs.snoozes + o.snoozed,
       worker_ids = CASE WHEN o.refund > 0 THEN jobs.worker_ids - (-1) ELSE jobs.worker_ids END,
       last_error = COALESCE(o.error, jobs.last_error),
       last_traceback = COALESCE(o.traceback, jobs.last_traceback),
       result = o.result::jsonb,
       started_at = CASE WHEN o.started_ago = 'NaN' THEN NULL
                         WHEN o.started_ago IS NULL THEN jobs.started_at
                         ELSE GREATEST(jobs.claimed_at,
                                       {moment} - o.started_ago * interval '1 second') END
  FROM unnest(%b::uuid[], %b::timestamptz[], %b::text[], %b::float8[], %b::int[],
              %b::text[], %b::text[], %b::text[], %b::float8[], %b::int[], %b::int[])
       AS o(id, claimed_at, status, delay, refund, error, traceback, result, started_ago,
            snoozed, suspended)
 WHERE jobs.id = o.id
   AND jobs.claimed_at = o.claimed_at
   AND jobs.worker_id = %s
   AND {_HELD}
RETURNING jobs.id, o.status, o.refund, o.snoozed, o.suspended,
          jobs.attempts + o.refund AS attempt,
          jobs.started_at, o.error, o.traceback
), recorded AS (
INSERT INTO pgqueue_job_attempts
       (job_id, attempt, worker_id, started_at, ended_at, outcome, error, traceback)
SELECT id, attempt, %s, started_at, {moment},
       CASE WHEN status <> {_PENDING} THEN status
            WHEN snoozed > 0 THEN 'snoozed' WHEN suspended > 0 THEN 'suspended'
            ELSE 'retried' END,
       COALESCE(error, ''), COALESCE(traceback, '')
  FROM finished
 WHERE status <> {_COMPLETED} AND (refund = 0 OR snoozed > 0 OR suspended > 0)
)
SELECT id FROM finished
"""


FINISH = _finish("now()")
FINISH_IN_TRANSACTION = _finish("statement_timestamp()")


# FINISH for a batch in which every job completed with no result and no note: what
# FINISH writes for such outcomes, from two arrays instead of eight (most batches).
# A binary float array has no NULL: NaN stands for "keep the claim's started_at".
FINISH_COMPLETED = f"""
UPDATE pgqueue_jobs AS jobs
   SET status = {_COMPLETED},
       progress = 100,
       completed_at = now(),
       result = NULL,
       started_at = CASE WHEN o.started_ago = 'NaN' THEN jobs.started_at
                         ELSE GREATEST(jobs.claimed_at,
                                       now() - o.started_ago * interval '1 second') END
  FROM unnest(%b::uuid[], %b::timestamptz[], %b::float8[]) AS o(id, claimed_at, started_ago)
 WHERE jobs.id = o.id
   AND jobs.claimed_at = o.claimed_at
   AND jobs.worker_id = %s
   AND {_HELD}
RETURNING jobs.id
"""

# FINISH_COMPLETED for one job, in its handler's transaction: a function whose plan the
# session keeps (sql/complete_in_transaction_v2.sql); true when the attempt's claim still
# held the job. Parameters: the job's id, its claimed_at, the worker's id, the seconds
# since the handler started (NaN: keep the claim's started_at).
COMPLETE_IN_TRANSACTION = "SELECT pgqueue_complete_in_transaction(%s, %s, %s, %s)"

# Only the jobs the worker knows it holds: a claim whose answer was lost with the
# connection must go stale and be recovered, not be kept alive forever.
HEARTBEAT = f"""
UPDATE pgqueue_jobs
   SET heartbeat_at = now()
 WHERE id = ANY(%s::uuid[]) AND worker_id = %s AND {status_in(IN_FLIGHT)}
RETURNING id, cancel_requested_at IS NOT NULL
"""

REGISTER_WORKER = """
INSERT INTO pgqueue_workers
       (worker_id, hostname, pid, queues, job_types, concurrency, started_at, heartbeat_at)
VALUES (%s, %s, %s, %s::jsonb, %s::jsonb, %s, now(), now())
ON CONFLICT (worker_id) DO UPDATE
   SET hostname = EXCLUDED.hostname, pid = EXCLUDED.pid, queues = EXCLUDED.queues,
       job_types = EXCLUDED.job_types, concurrency = EXCLUDED.concurrency,
       started_at = now(), heartbeat_at = now(), stopped_at = NULL
"""

# A worker's beat, one statement: its row's heartbeat, whether it leads (liveness.py:
# no live worker has a lower id; the statement's snapshot predates its own beat, so a
# worker whose last beat is stale may still lead), whether any rate limit exists, and
# whether any concurrency limit does (room a finished job frees announces nothing: idle
# workers then poll). The leader alone recovers, prunes, writes the rollups, enqueues
# the periodic jobs and wakes idle workers (WAKE_DUE_QUEUES).
WORKER_BEAT = f"""
WITH beat AS (
    UPDATE pgqueue_workers SET heartbeat_at = now() WHERE worker_id = %(worker)s RETURNING 1
)
SELECT EXISTS (SELECT FROM beat) AND coalesce({LEADER} >= %(worker)s, true),
       EXISTS (SELECT FROM pgqueue_rate_limits),
       EXISTS (SELECT FROM pgqueue_limits WHERE max_running IS NOT NULL)
"""

#: The payload of the leader's tick: not a queue name (validation.queue refuses it).
TICK = ""

# The leader's wake-up call (worker/listener.py), every poll interval: a NOTIFY for each
# queue with pending jobs whose run_at passed since one lookback before the server's
# moment of the last call (%(since)s; NULL: now), then the tick that tells idle workers
# the calls go on. It names the jobs that became due with time (delayed jobs, retries,
# snoozes, sleeps, recovered jobs) and those inserted with SQL without a NOTIFY; the
# lookback covers a transaction that committed a job just after the last call read the
# table. The walk reads idx_jobs_claimable once per distinct priority of pending jobs,
# and only the entries of the window.
WAKE_DUE_QUEUES = f"""
WITH RECURSIVE priorities(priority) AS (
    (SELECT priority FROM pgqueue_jobs
      WHERE status = {_PENDING} AND NOT held ORDER BY priority DESC LIMIT 1)
  UNION ALL
    SELECT (SELECT jobs.priority FROM pgqueue_jobs AS jobs
             WHERE jobs.status = {_PENDING} AND NOT jobs.held AND jobs.priority < p.priority
             ORDER BY jobs.priority DESC LIMIT 1)
      FROM priorities AS p
     WHERE p.priority IS NOT NULL
), woken AS (
    SELECT DISTINCT due.queue
      FROM priorities AS p,
           LATERAL (
               SELECT queue FROM pgqueue_jobs
                WHERE status = {_PENDING} AND NOT held AND priority = p.priority
                  AND run_at > coalesce(%(since)s::timestamptz, now())
                                 - %(lookback)s * interval '1 second'
                  AND {DUE}
               OFFSET 0  -- kept apart: one index range per priority, not a whole scan
           ) AS due
)
SELECT now(),
       (SELECT count(pg_notify(%(channel)s, queue))
          FROM (SELECT queue FROM woken UNION ALL SELECT {TICK!r}) AS calls (queue))
"""

WORKER_STOPPED = (
    "UPDATE pgqueue_workers SET stopped_at = now(), heartbeat_at = now() WHERE worker_id = %s"
)

# Rows of workers gone for a day are only history: keep the table small.
FORGET_OLD_WORKERS = """
DELETE FROM pgqueue_workers WHERE heartbeat_at < now() - interval '1 day'
"""

# The channel the database's release of workflow steps notifies (sql/workflow_settle_v1.sql).
RELEASE_CHANNEL = (
    "SELECT coalesce(nullif(current_setting('pgqueue.notify_channel', true), ''), 'pgqueue_jobs')"
)
