-- One claim-and-complete round of a worker, in the same SQL shape as django-pgqueue:
-- claim up to :batch due jobs in claim order with FOR UPDATE SKIP LOCKED and mark them
-- claimed (one transaction), then mark them completed (a second transaction).
-- Run by bench/run.py: pgbench -M extended -D batch=N -f claim_complete.sql
WITH due AS (
    SELECT id
      FROM pgqueue_jobs
     WHERE status = 'pending' AND run_at <= now()
     ORDER BY priority DESC, run_at, created_at
     LIMIT :batch
       FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE pgqueue_jobs AS jobs
       SET status = 'claimed', worker_id = 'pgbench', claimed_at = now(),
           heartbeat_at = now(), attempts = jobs.attempts + 1
      FROM due
     WHERE jobs.id = due.id
 RETURNING jobs.id
)
SELECT coalesce(array_agg(id), '{}')::text AS ids FROM claimed
\gset
UPDATE pgqueue_jobs
   SET status = 'completed', progress = 100, completed_at = now()
 WHERE id = ANY (:ids::uuid[]) AND worker_id = 'pgbench' AND status = 'claimed';
