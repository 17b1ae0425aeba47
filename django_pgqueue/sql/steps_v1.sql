-- Steps, version 1: pgqueue_write_checkpoint, where an attempt stores the checkpoint of
-- a step (job.step()) or a sleep (job.sleep()). Waits for events have their own,
-- pgqueue_await_event (events_v1.sql).
--
-- A function rather than a statement sent by the worker: PL/pgSQL keeps the plan of
-- its INSERT for the life of the connection, which a statement sent as text (never
-- prepared, so that a transaction pooler can run it) would pay for on every step.
--
-- The checkpoint is written only while the attempt holds the job: the job is claimed
-- or running, by p_worker_id, at attempt p_attempt. Returns whether it was written.
-- p_unflushed commits without waiting for the disk (synchronous_commit off for this
-- transaction): a plain step's checkpoint, committed on its own, whose loss in a
-- database crash only runs the step again. An atomic step's, written in the caller's
-- transaction, passes false and leaves that transaction's commit as it was.
CREATE FUNCTION pgqueue_write_checkpoint(p_job_id uuid, p_worker_id text, p_attempt integer,
                                         p_name text, p_kind text, p_result jsonb,
                                         p_wake_at timestamptz, p_started timestamptz,
                                         p_unflushed boolean)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF p_unflushed THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    INSERT INTO pgqueue_job_steps
           (job_id, name, kind, attempt, result, wake_at, started_at, completed_at)
    SELECT j.id, p_name, p_kind, j.attempts, p_result, p_wake_at, p_started, now()
      FROM pgqueue_jobs AS j
     WHERE j.id = p_job_id AND j.status IN ('claimed', 'running')
       AND j.worker_id IS NOT DISTINCT FROM p_worker_id AND j.attempts = p_attempt;
    RETURN FOUND;
END;
$$;
