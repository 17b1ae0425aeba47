-- Workflow steps, version 1: the dependents of a job are settled in the transaction
-- that finishes it, whoever finishes it (a worker, cancel(), recovery, the admin).
--
-- * A job enqueued with depends_on is "waiting": one edge per dependency in
--   pgqueue_job_dependencies, and a counter of unresolved edges in pgqueue_job_waits.
-- * An edge is resolved by its dependency's status: "completed" resolves every edge,
--   "failed" and "cancelled" only "run" and "run_only" edges (pgqueue_edge_resolved). Edges are
--   never written after the enqueue: each change of a dependency's status moves its
--   dependents' counters by what it resolved (or, on retry, unresolved), O(1) per
--   edge however many dependencies the dependent has. A counter that reaches zero is
--   deleted and its job becomes pending (due from then on), with a NOTIFY for its
--   queue.
-- * A job with "run_only" edges runs only if one of those dependencies failed or was
--   cancelled: released with none such, it is cancelled as not needed.
-- * Under "cancel" edges, a failed or cancelled dependency cancels the waiting jobs
--   that depend on it, transitively; each remembers the job that cancelled it
--   (cancelled_by_id). Retrying a job puts back to waiting what its failure cancelled,
--   unless another of their dependencies has failed too.
--
-- Exactly once: the counters are row-locked in the order of their job ids before they
-- are lowered, so two transactions finishing two dependencies of one job at once take
-- turns, the second sees the first's count, and only the one that reaches zero
-- releases the job. One order for every transaction: concurrent finishes of many
-- dependents' dependencies cannot deadlock on the counters.
--
-- How: a row trigger on pgqueue_jobs notes each finished (or retried) job of a
-- workflow, with its old and new status, in pgqueue_job_settlements under the
-- transaction's id; a statement trigger then settles all of the statement's notes
-- together, sorted. The row trigger's WHEN
-- clause keeps jobs outside workflows (workflow_id IS NULL) free of any call; the
-- statement trigger runs for every UPDATE of status and returns at once unless a note
-- was taken (a transaction-local setting says so).
--
-- The NOTIFY goes to the channel in the setting pgqueue.notify_channel (ALTER DATABASE
-- ... SET, for a PGQUEUE["NOTIFY_CHANNEL"] other than the default), else pgqueue_jobs.

-- Notes of the current transactions: each row lives from a job's finish to the end of
-- the statement that finished it. Unlogged: nothing in it outlives a transaction.
CREATE UNLOGGED TABLE pgqueue_job_settlements (
    xact xid8 NOT NULL,
    job_id uuid NOT NULL,
    old_status text NOT NULL,
    new_status text NOT NULL
);

-- Whether an edge with this policy is resolved while its dependency has this status.
CREATE FUNCTION pgqueue_edge_resolved(p_on_failure text, p_status text)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_status = 'completed'
        OR (p_on_failure <> 'cancel' AND p_status IN ('failed', 'cancelled'))
$$;
CREATE INDEX idx_job_settlements_xact ON pgqueue_job_settlements (xact);

-- Cancel the waiting jobs that depend on the failed or cancelled p_roots under
-- "cancel" edges, transitively.
CREATE FUNCTION pgqueue_cancel_dependents(p_roots uuid[])
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    WITH RECURSIVE doomed(job_id, cause, root) AS (
        SELECT d.job_id, d.dependency_id, d.dependency_id
          FROM pgqueue_job_dependencies AS d
          JOIN pgqueue_jobs AS j ON j.id = d.job_id
         WHERE d.dependency_id = ANY(p_roots)
           AND d.on_failure = 'cancel' AND j.status = 'waiting'
        UNION
        SELECT d.job_id, d.dependency_id, doomed.root
          FROM doomed
          JOIN pgqueue_job_dependencies AS d ON d.dependency_id = doomed.job_id
          JOIN pgqueue_jobs AS j ON j.id = d.job_id
         WHERE d.on_failure = 'cancel' AND j.status = 'waiting'
    ), chosen AS (
        SELECT DISTINCT ON (job_id) job_id, cause, root
          FROM doomed
         ORDER BY job_id, cause = root DESC, cause
    ), marked AS (
        UPDATE pgqueue_job_waits AS w SET cancelled_by_id = chosen.cause
          FROM chosen
         WHERE w.job_id = chosen.job_id
    )
    UPDATE pgqueue_jobs AS j
       SET status = 'cancelled', completed_at = now(), held = false,
           last_error = CASE WHEN chosen.cause = chosen.root
               THEN format('Cancelled: job %s, which it depends on, is %s.',
                           chosen.root, root.status)
               ELSE format('Cancelled: job %s, which it depends on, was cancelled '
                           'because job %s is %s.', chosen.cause, chosen.root, root.status)
           END
      FROM chosen
      JOIN pgqueue_jobs AS root ON root.id = chosen.root
     WHERE j.id = chosen.job_id AND j.status = 'waiting';
END
$$;

-- Put back to waiting the jobs that p_retried (now waiting or pending again) had
-- cancelled, transitively; then cancel again what still depends on a failed job.
CREATE FUNCTION pgqueue_resume_dependents(p_retried uuid[])
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_blockers uuid[];
BEGIN
    UPDATE pgqueue_job_waits SET cancelled_by_id = NULL
     WHERE job_id = ANY(p_retried) AND cancelled_by_id IS NOT NULL;
    WITH RECURSIVE resumed(job_id) AS (
        SELECT w.job_id FROM pgqueue_job_waits AS w WHERE w.cancelled_by_id = ANY(p_retried)
        UNION
        SELECT w.job_id
          FROM resumed
          JOIN pgqueue_job_waits AS w ON w.cancelled_by_id = resumed.job_id
    ), cleared AS (
        UPDATE pgqueue_job_waits AS w SET cancelled_by_id = NULL
          FROM resumed
         WHERE w.job_id = resumed.job_id
    )
    UPDATE pgqueue_jobs AS j
       SET status = 'waiting', completed_at = NULL, last_error = ''
      FROM resumed
     WHERE j.id = resumed.job_id AND j.status = 'cancelled';
    -- A retried job that still depends on a failed or cancelled job is cancelled again
    -- at once (its resumed dependents are settled as retried jobs in turn).
    SELECT array_agg(DISTINCT d.dependency_id) INTO v_blockers
      FROM pgqueue_job_dependencies AS d
      JOIN pgqueue_jobs AS dependency ON dependency.id = d.dependency_id
     WHERE d.job_id = ANY(p_retried) AND d.on_failure = 'cancel'
       AND dependency.status IN ('failed', 'cancelled');
    IF v_blockers IS NOT NULL THEN
        PERFORM pgqueue_cancel_dependents(v_blockers);
    END IF;
END
$$;

-- Settle the dependents of the jobs p_ids, whose status changed from p_old to p_new in
-- this transaction: finished, or retried (see the top of this file).
CREATE FUNCTION pgqueue_settle_jobs(p_ids uuid[], p_old text[], p_new text[])
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_channel text := coalesce(
        nullif(current_setting('pgqueue.notify_channel', true), ''), 'pgqueue_jobs');
    v_failed uuid[];
    v_retried uuid[];
    v_dependents uuid[];
    v_counts integer[];
    v_released uuid[];
    v_queues text[];
    v_types text[];
    v_keys text[];
BEGIN
    -- What each change resolved (or, on retry, unresolved), per dependent.
    WITH moved AS (
        SELECT d.job_id,
               sum(pgqueue_edge_resolved(d.on_failure, s.new)::integer
                   - pgqueue_edge_resolved(d.on_failure, s.old)::integer)::integer AS edges
          FROM unnest(p_ids, p_old, p_new) AS s(id, old, new)
          JOIN pgqueue_job_dependencies AS d ON d.dependency_id = s.id
         GROUP BY d.job_id
    )
    SELECT array_agg(job_id ORDER BY job_id), array_agg(edges ORDER BY job_id)
      INTO v_dependents, v_counts
      FROM moved
     WHERE edges <> 0;

    IF v_dependents IS NOT NULL THEN
        PERFORM 1 FROM pgqueue_job_waits
         WHERE job_id = ANY(v_dependents)
         ORDER BY job_id
           FOR UPDATE;
        -- A dependent already released has no counter left: a retry does not hold it back.
        WITH done AS (
            DELETE FROM pgqueue_job_waits AS w
             USING unnest(v_dependents, v_counts) AS c(job_id, edges)
             WHERE w.job_id = c.job_id AND w.unresolved <= c.edges
            RETURNING w.job_id
        ), moved AS (
            UPDATE pgqueue_job_waits AS w SET unresolved = w.unresolved - c.edges
              FROM unnest(v_dependents, v_counts) AS c(job_id, edges)
             WHERE w.job_id = c.job_id AND w.unresolved > c.edges
        )
        SELECT array_agg(job_id) INTO v_released FROM done;
    END IF;

    IF v_released IS NOT NULL THEN
        -- Not needed: a job that runs only after a failure, when none came.
        UPDATE pgqueue_jobs AS j
           SET status = 'cancelled', completed_at = now(), held = false,
               last_error = 'Not run: it runs only after a failure of a job it waits '
                            'for, and every one of them completed.'
         WHERE j.id = ANY(v_released) AND j.status = 'waiting'
           AND EXISTS (SELECT 1 FROM pgqueue_job_dependencies AS d
                        WHERE d.job_id = j.id AND d.on_failure = 'run_only')
           AND NOT EXISTS (SELECT 1 FROM pgqueue_job_dependencies AS d
                             JOIN pgqueue_jobs AS dependency ON dependency.id = d.dependency_id
                            WHERE d.job_id = j.id AND d.on_failure = 'run_only'
                              AND dependency.status IN ('failed', 'cancelled'));
        -- Due from its release on (or at its run_at, if later); held like a due job
        -- enqueued with a key, then admitted by its key's limit (key_limits_v2.sql).
        WITH released AS (
            UPDATE pgqueue_jobs AS j
               SET status = 'pending', run_at = greatest(j.run_at, now()),
                   held = j.concurrency_key IS NOT NULL AND j.run_at <= now()
             WHERE j.id = ANY(v_released) AND j.status = 'waiting'
            RETURNING j.queue, j.run_at, j.job_type, j.concurrency_key, j.held
        )
        SELECT array_agg(DISTINCT queue) FILTER (WHERE run_at <= now()),
               array_agg(job_type) FILTER (WHERE held),
               array_agg(concurrency_key) FILTER (WHERE held)
          INTO v_queues, v_types, v_keys
          FROM released;
        IF v_types IS NOT NULL THEN
            PERFORM pgqueue_release_held_keys(v_types, v_keys);
        END IF;
        IF v_queues IS NOT NULL THEN
            PERFORM pg_notify(v_channel, queue) FROM unnest(v_queues) AS queue;
        END IF;
    END IF;

    SELECT array_agg(s.id) FILTER (WHERE s.new IN ('failed', 'cancelled')),
           array_agg(s.id) FILTER (WHERE s.old IN ('failed', 'cancelled')
                                     AND s.new IN ('waiting', 'pending'))
      INTO v_failed, v_retried
      FROM unnest(p_ids, p_old, p_new) AS s(id, old, new);
    IF v_failed IS NOT NULL THEN
        PERFORM pgqueue_cancel_dependents(v_failed);
    END IF;
    IF v_retried IS NOT NULL THEN
        PERFORM pgqueue_resume_dependents(v_retried);
    END IF;
END
$$;

CREATE FUNCTION pgqueue_note_settlement()
RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO pgqueue_job_settlements (xact, job_id, old_status, new_status)
    VALUES (pg_current_xact_id(), NEW.id, OLD.status, NEW.status);
    PERFORM set_config('pgqueue.settle', 'on', true);
    RETURN NULL;
END
$$;

CREATE FUNCTION pgqueue_settle_statement()
RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_ids uuid[];
    v_old text[];
    v_new text[];
BEGIN
    IF current_setting('pgqueue.settle', true) IS DISTINCT FROM 'on' THEN
        RETURN NULL;
    END IF;
    PERFORM set_config('pgqueue.settle', '', true);
    WITH taken AS (
        DELETE FROM pgqueue_job_settlements WHERE xact = pg_current_xact_id()
        RETURNING job_id, old_status, new_status
    )
    SELECT array_agg(job_id), array_agg(old_status), array_agg(new_status)
      INTO v_ids, v_old, v_new
      FROM taken;
    IF v_ids IS NOT NULL THEN
        PERFORM pgqueue_settle_jobs(v_ids, v_old, v_new);
    END IF;
    RETURN NULL;
END
$$;

-- Finished: completed, failed or cancelled. Retried: from failed or cancelled back to
-- waiting or pending.
CREATE TRIGGER pgqueue_jobs_note_settlement
    AFTER UPDATE OF status ON pgqueue_jobs
    FOR EACH ROW
    WHEN (NEW.workflow_id IS NOT NULL AND OLD.status IS DISTINCT FROM NEW.status
          AND (NEW.status IN ('completed', 'failed', 'cancelled')
               OR (OLD.status IN ('failed', 'cancelled')
                   AND NEW.status IN ('waiting', 'pending'))))
    EXECUTE FUNCTION pgqueue_note_settlement();

CREATE TRIGGER pgqueue_jobs_settle
    AFTER UPDATE OF status ON pgqueue_jobs
    FOR EACH STATEMENT
    EXECUTE FUNCTION pgqueue_settle_statement();
