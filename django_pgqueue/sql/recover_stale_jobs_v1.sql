-- recover_stale_jobs: release jobs whose worker stopped heartbeating.
--
-- A job is stale when it is claimed or running and its heartbeat is older than
-- p_stale_after. A claimed job never started, so its attempt is given back; a
-- running job whose attempts are spent ends failed (the dead-letter state) instead of
-- staying stuck; every other stale job returns to pending, due now.
--
-- SKIP LOCKED makes concurrent recoveries safe: each stale row is recovered by exactly
-- one caller, and rows a live worker is finishing right now are left alone.
CREATE FUNCTION recover_stale_jobs(p_stale_after interval)
RETURNS TABLE (
    recovered_id uuid,
    recovered_job_type varchar,
    previous_worker_id varchar,
    new_status varchar,
    attempts_made integer
)
LANGUAGE plpgsql
AS $$
BEGIN
    -- A zero or negative age would "recover" jobs of live workers.
    IF p_stale_after IS NULL OR p_stale_after <= interval '0' THEN
        RAISE EXCEPTION 'recover_stale_jobs: p_stale_after must be a positive interval, got %',
            p_stale_after
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    RETURN QUERY
    WITH stale AS (
        SELECT id, worker_id, status, attempts >= max_attempts AS exhausted,
               COALESCE(heartbeat_at, claimed_at) AS last_seen
          FROM pgqueue_jobs
         WHERE status IN ('claimed', 'running')
           AND COALESCE(heartbeat_at, claimed_at, created_at) < now() - p_stale_after
         FOR UPDATE SKIP LOCKED
    )
    UPDATE pgqueue_jobs AS jobs
       SET status = CASE WHEN stale.status = 'running' AND stale.exhausted
                         THEN 'failed' ELSE 'pending' END,
           attempts = CASE WHEN stale.status = 'claimed'
                           THEN greatest(jobs.attempts - 1, 0) ELSE jobs.attempts END,
           worker_ids = CASE WHEN stale.status = 'claimed'
                             THEN jobs.worker_ids - (-1) ELSE jobs.worker_ids END,
           completed_at = CASE WHEN stale.status = 'running' AND stale.exhausted
                               THEN now() END,
           worker_id = NULL,
           run_at = now(),
           last_error = format(
               'worker %s stopped heartbeating (last seen %s) while the job was %s '
               '(attempt %s of %s)',
               stale.worker_id, stale.last_seen, stale.status, jobs.attempts,
               jobs.max_attempts),
           last_traceback = ''
      FROM stale
     WHERE jobs.id = stale.id
    RETURNING jobs.id, jobs.job_type, stale.worker_id, jobs.status, jobs.attempts;
END;
$$;
