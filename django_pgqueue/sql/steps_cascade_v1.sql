-- Deleting jobs deletes their checkpoints, by a statement trigger instead of the foreign
-- key of pgqueue_job_steps (job_steps_job_fk_v1.sql), which this replaces.
--
-- Every checkpoint a step writes ran the foreign key's check: a lookup of the job that
-- also locks its row (FOR KEY SHARE), which writes the lock into the job's row and the
-- WAL, about 50 of the checkpoint's 400 bytes, and as much work again as its insert.
-- pgqueue_write_checkpoint() already inserts a checkpoint only for a job that exists and
-- that the attempt holds, so the check added nothing but that cost.
--
-- What the key's ON DELETE CASCADE did, the trigger does: after each statement that
-- deletes jobs (pruning, the ORM, SQL), one DELETE of their checkpoints. A running job
-- deleted by hand while its step writes a checkpoint may leave that one row behind, which
-- nothing reads (it names no job).
ALTER TABLE pgqueue_job_steps DROP CONSTRAINT pgqueue_job_steps_job_fk;

CREATE FUNCTION pgqueue_delete_job_steps() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    DELETE FROM pgqueue_job_steps AS steps
     USING deleted_jobs
     WHERE steps.job_id = deleted_jobs.id;
    RETURN NULL;
END
$$;

CREATE TRIGGER pgqueue_jobs_delete_steps
    AFTER DELETE ON pgqueue_jobs
    REFERENCING OLD TABLE AS deleted_jobs
    FOR EACH STATEMENT
    EXECUTE FUNCTION pgqueue_delete_job_steps();
