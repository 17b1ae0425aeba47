-- One cycle of a worker's main loop, in the same SQL shape as django-pgqueue's: one
-- transaction that records the outcomes of the jobs the previous cycle claimed and
-- claims the next batch of up to :batch due jobs in claim order with FOR UPDATE SKIP
-- LOCKED, marking them running. The ids of a client's claim are its next round's
-- :ids; run.py's pgbench_drain() starts every client with none (-D ids={}) and
-- completes the last round's jobs once pgbench is done.
-- Run by bench/run.py: pgbench -M extended -D batch=N -D ids={} -f claim_complete.sql
BEGIN;
UPDATE pgqueue_jobs
   SET status = 'completed', progress = 100, completed_at = now()
 WHERE id = ANY (:ids::uuid[]) AND worker_id = 'pgbench' AND status = 'running';
WITH due AS (
    SELECT id
      FROM pgqueue_jobs
     WHERE status = 'pending' AND run_at <= now()
     ORDER BY priority DESC, run_at, created_at
     LIMIT :batch
       FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE pgqueue_jobs AS jobs
       SET status = 'running', worker_id = 'pgbench', claimed_at = now(),
           started_at = now(), heartbeat_at = now(), attempts = jobs.attempts + 1,
           worker_ids = jobs.worker_ids || '"pgbench"'::jsonb
      FROM due
     WHERE jobs.id = due.id
 RETURNING jobs.id
)
SELECT coalesce(array_agg(id), '{}')::text AS ids FROM claimed
\gset
COMMIT;
