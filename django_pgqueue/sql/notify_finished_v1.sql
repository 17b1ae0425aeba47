-- The NOTIFY that wakes code waiting for a job to finish (Job.wait(), Job.await_result()).
--
-- A waiter LISTENs on pgqueue_finished, then marks the job awaited; when the job's
-- status becomes completed, failed or cancelled, whatever wrote it (a worker's batched
-- finish, a cancellation, recovery, a workflow's cascade), this trigger notifies the
-- channel with the job's id, delivered when that transaction commits.
--
-- Only awaited jobs notify: the trigger's WHEN clause is checked in C for every finished
-- row, and only an awaited one runs the function. A drain of jobs nobody waits for pays
-- nothing but that check, and sends no notification.
CREATE FUNCTION pgqueue_notify_finished() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM pg_notify('pgqueue_finished', NEW.id::text);
    RETURN NULL;
END
$$;

CREATE TRIGGER pgqueue_jobs_notify_finished
    AFTER UPDATE OF status ON pgqueue_jobs
    FOR EACH ROW
    WHEN (NEW.awaited AND NEW.status IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION pgqueue_notify_finished();
