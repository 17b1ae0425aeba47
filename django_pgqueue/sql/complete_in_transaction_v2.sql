-- The completion of one job, written in its atomic handler's transaction so that the
-- handler's writes and the completion commit together, once (effectively once).
-- Version 2 of complete_in_transaction_v1.sql: the attempt is named by its claim too.
--
-- A function rather than a statement sent each time: PL/pgSQL keeps the UPDATE's plan
-- for the session, where a statement sent unprepared (a transaction pooler may sit in
-- between) would be planned at every job against the table's dozen indexes, which
-- cost more than the update itself.
--
-- Only while the attempt's claim holds the job (the worker's id and the claim's
-- claimed_at, the job claimed or running): returns false otherwise, and the worker then
-- rolls the handler's transaction back. Recovery may have taken the job back and the
-- same worker claimed it again meanwhile: the earlier run must not complete the later.
-- Moments are the statement's (statement_timestamp()), not the handler's transaction's:
-- it began at the handler's first query.
-- p_started_ago: seconds between the handler's start and this statement, by the
-- worker's monotonic clock (NaN: keep the claim's started_at); never before the claim.
CREATE FUNCTION pgqueue_complete_in_transaction(
    p_job_id uuid,
    p_claimed_at timestamptz,
    p_worker_id text,
    p_started_ago float8
) RETURNS boolean
LANGUAGE plpgsql
AS $$
BEGIN
    UPDATE pgqueue_jobs AS jobs
       SET status = 'completed',
           progress = 100,
           completed_at = statement_timestamp(),
           result = NULL,
           started_at = CASE WHEN p_started_ago = 'NaN' THEN jobs.started_at
                             ELSE GREATEST(jobs.claimed_at,
                                           statement_timestamp()
                                           - p_started_ago * interval '1 second') END
     WHERE jobs.id = p_job_id
       AND jobs.claimed_at = p_claimed_at
       -- Not "=": the index on the worker's jobs would then be chosen, and walk every
       -- job the worker holds (its prefetched ones too) instead of one primary key.
       AND jobs.worker_id IS NOT DISTINCT FROM p_worker_id
       AND jobs.status IN ('claimed', 'running');
    RETURN FOUND;
END
$$;
