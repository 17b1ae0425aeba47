-- Steps, version 2: pgqueue_write_checkpoints, where a worker's checkpoint writer
-- (checkpoint_writer.py) stores the checkpoints of plain steps that several of its
-- slots finished meanwhile, in one transaction. Adds to version 1, whose
-- pgqueue_write_checkpoint stays the way of sleeps, atomic steps and steps run
-- outside a worker.
--
-- Element i of each array describes one checkpoint, in the order they were handed to
-- the writer, which is the order their ids follow. Each is written only while its
-- attempt holds the job (the job is claimed or running, by p_worker_ids[i], at attempt
-- p_attempts[i]); one whose name is already stored for its job is left as it is
-- rather than failing the others. The moments the step's function started and
-- returned are given as seconds ago, on the database's clock. The transaction commits
-- without waiting for the disk: a database crash may lose the last checkpoints, which
-- only runs those steps again (plain steps are at least once). Returns how many were
-- written.
CREATE FUNCTION pgqueue_write_checkpoints(p_job_ids uuid[], p_worker_ids text[],
                                          p_attempts integer[], p_names text[],
                                          p_results jsonb[], p_started_ago float8[],
                                          p_completed_ago float8[])
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    written integer;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    INSERT INTO pgqueue_job_steps
           (job_id, name, kind, attempt, result, started_at, completed_at)
    SELECT j.id, c.name, 'step', j.attempts, c.result,
           clock_timestamp() - c.started_ago * interval '1 second',
           clock_timestamp() - c.completed_ago * interval '1 second'
      FROM unnest(p_job_ids, p_worker_ids, p_attempts, p_names, p_results,
                  p_started_ago, p_completed_ago) WITH ORDINALITY
           AS c(job_id, worker_id, attempt, name, result, started_ago, completed_ago, n)
      JOIN pgqueue_jobs AS j ON j.id = c.job_id
     WHERE j.status IN ('claimed', 'running')
       AND j.worker_id IS NOT DISTINCT FROM c.worker_id AND j.attempts = c.attempt
     ORDER BY c.n
    ON CONFLICT (job_id, name) DO NOTHING;
    GET DIAGNOSTICS written = ROW_COUNT;
    RETURN written;
END;
$$;
