-- recover_stale_jobs, version 4: as version 3 (recover_stale_jobs_v3.sql; the same
-- signature and results), and a running job it takes back is marked as lost with its
-- worker (pgqueue_jobs.lost_with_worker), for good: a claim gives a worker at most one
-- such job at a time (claim_job_batch_v10.sql), so that a job that kills its worker
-- never runs beside another that died in a worker before, which it would kill again.
-- A claimed job, never started, is not marked: it ran no code.
--
-- The random delay of version 3 stays: it spreads the jobs of a dead worker over a few
-- seconds, as a retry's backoff does, so that restarted workers do not claim them all
-- at the same moment.
CREATE OR REPLACE FUNCTION recover_stale_jobs(p_stale_after interval)
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
               COALESCE(heartbeat_at, claimed_at) AS last_seen, started_at
          FROM pgqueue_jobs
         WHERE status IN ('claimed', 'running')
           AND COALESCE(heartbeat_at, claimed_at, created_at) < now() - p_stale_after
         FOR UPDATE SKIP LOCKED
    ), recovered AS (
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
               lost_with_worker = jobs.lost_with_worker OR stale.status = 'running',
               run_at = CASE WHEN stale.status = 'running'
                             THEN now() + random() * least(power(2, jobs.attempts), 60)
                                          * interval '1 second'
                             ELSE now() END,
               progress = 0,
               current_stage = '',
               last_error = format(
                   'worker %s stopped heartbeating (last seen %s) while the job was %s '
                   '(attempt %s of %s)',
                   stale.worker_id, stale.last_seen, stale.status, jobs.attempts,
                   jobs.max_attempts),
               last_traceback = ''
          FROM stale
         WHERE jobs.id = stale.id
        RETURNING jobs.id, jobs.job_type, stale.worker_id, jobs.status, jobs.attempts,
                  stale.status AS old_status, stale.started_at, jobs.last_error
    ), recorded AS (
        INSERT INTO pgqueue_job_attempts
               (job_id, attempt, worker_id, started_at, ended_at, outcome, error)
        SELECT recovered.id, recovered.attempts, recovered.worker_id, recovered.started_at,
               now(), 'lost', recovered.last_error
          FROM recovered
         WHERE recovered.old_status = 'running'
    )
    SELECT recovered.id, recovered.job_type, recovered.worker_id, recovered.status,
           recovered.attempts
      FROM recovered;
END;
$$;
