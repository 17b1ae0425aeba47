-- claim_job_batch: atomically claim up to p_batch_size due jobs for one worker.
--
-- The CTE walks idx_jobs_claimable in claim order (priority DESC, created_at ASC),
-- filters on run_at/queue/job_type inside the index, and locks rows with
-- SKIP LOCKED so concurrent workers never block on, or receive, the same job.
-- The UPDATE then marks the rows claimed in the same statement, and records the
-- worker of this attempt in worker_ids.
--
-- NULL p_job_types or p_queues means "any". plan_cache_mode = force_custom_plan lets
-- the planner see the actual arguments, so "NULL means any" folds away and the
-- remaining filters stay index conditions instead of row filters.
--
-- enable_sort = off pins the plan to an ordered walk of idx_jobs_claimable that stops
-- after p_batch_size rows. Queue tables change faster than statistics: right after a
-- bulk enqueue the planner believes a handful of rows are pending, picks a bitmap scan
-- and sorts every pending row on every claim (measured: 6 ms instead of 0.2 ms per
-- claim with 20k pending jobs).
CREATE FUNCTION claim_job_batch(
    p_worker_id text,
    p_job_types text[],
    p_batch_size integer DEFAULT 10,
    p_queues text[] DEFAULT NULL
) RETURNS SETOF pgqueue_jobs
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan
SET enable_sort = off
AS $$
BEGIN
    IF p_worker_id IS NULL OR p_worker_id = '' THEN
        RAISE EXCEPTION 'claim_job_batch: p_worker_id must be a non-empty string'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_batch_size IS NULL OR p_batch_size < 1 OR p_batch_size > 10000 THEN
        RAISE EXCEPTION 'claim_job_batch: p_batch_size must be between 1 and 10000, got %',
            p_batch_size
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    RETURN QUERY
    WITH due AS (
        SELECT id
          FROM pgqueue_jobs
         WHERE status = 'pending'
           AND run_at <= now()
           AND (p_queues IS NULL OR queue = ANY (p_queues))
           AND (p_job_types IS NULL OR job_type = ANY (p_job_types))
         ORDER BY priority DESC, created_at ASC
         LIMIT p_batch_size
         FOR UPDATE SKIP LOCKED
    )
    UPDATE pgqueue_jobs AS jobs
       SET status = 'claimed',
           worker_id = p_worker_id,
           claimed_at = now(),
           heartbeat_at = now(),
           attempts = jobs.attempts + 1,
           worker_ids = jobs.worker_ids || to_jsonb(p_worker_id)
      FROM due
     WHERE jobs.id = due.id
    RETURNING jobs.*;
END;
$$;
