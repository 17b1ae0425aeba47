-- Workflow steps, version 2: as version 1 (workflow_settle_v1.sql, which explains the
-- design), but a finish finds the edges of the jobs it finished one job at a time,
-- through the index on pgqueue_job_dependencies (dependency_id, job_id), whatever the
-- planner's statistics say.
--
-- Version 1 joined the finished jobs to the edges, and until the edges table was first
-- analyzed the planner guessed a hash join over a scan of every edge: with the 10,000
-- edges of a chord just enqueued, each finish of a batch of members read all of them
-- (1.6 ms instead of 0.2). A lateral subquery with OFFSET 0 is not flattened into a
-- join, so it runs as one index lookup per finished job. The results are the same;
-- only the functions below change.
--
-- And the cascade of cancellations locks the jobs it cancels (their counters, then the
-- jobs) in the order of their ids before it changes them: version 1 updated them in
-- the order of its plan, so two transactions cancelling overlapping sets of dependents
-- could deadlock (one of them then failed and was retried).

-- Version 1's, with the lookup of dependents by index and its locks in id order (see
-- the top of this file).
CREATE OR REPLACE FUNCTION pgqueue_cancel_dependents(p_roots uuid[])
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_jobs uuid[];
    v_causes uuid[];
    v_roots uuid[];
BEGIN
    WITH RECURSIVE doomed(job_id, cause, root) AS (
        SELECT d.job_id, d.dependency_id, d.dependency_id
          FROM unnest(p_roots) AS r(id)
         CROSS JOIN LATERAL (
            SELECT e.job_id, e.dependency_id
              FROM pgqueue_job_dependencies AS e
             WHERE e.dependency_id = r.id AND e.on_failure = 'cancel'
            OFFSET 0
         ) AS d
          JOIN pgqueue_jobs AS j ON j.id = d.job_id
         WHERE j.status = 'waiting'
        UNION
        SELECT d.job_id, d.dependency_id, doomed.root
          FROM doomed
         CROSS JOIN LATERAL (
            SELECT e.job_id, e.dependency_id
              FROM pgqueue_job_dependencies AS e
             WHERE e.dependency_id = doomed.job_id AND e.on_failure = 'cancel'
            OFFSET 0
         ) AS d
          JOIN pgqueue_jobs AS j ON j.id = d.job_id
         WHERE j.status = 'waiting'
    ), chosen AS (
        SELECT DISTINCT ON (job_id) job_id, cause, root
          FROM doomed
         ORDER BY job_id, cause = root DESC, cause
    )
    SELECT array_agg(job_id ORDER BY job_id), array_agg(cause ORDER BY job_id),
           array_agg(root ORDER BY job_id)
      INTO v_jobs, v_causes, v_roots
      FROM chosen;
    IF v_jobs IS NULL THEN
        RETURN;
    END IF;
    -- Locked in id order, counters first, as a finish locks them: two transactions
    -- cancelling overlapping dependents take turns instead of deadlocking.
    PERFORM 1 FROM pgqueue_job_waits WHERE job_id = ANY(v_jobs) ORDER BY job_id FOR UPDATE;
    PERFORM 1 FROM pgqueue_jobs WHERE id = ANY(v_jobs) ORDER BY id FOR UPDATE;
    UPDATE pgqueue_job_waits AS w SET cancelled_by_id = chosen.cause
      FROM unnest(v_jobs, v_causes) AS chosen(job_id, cause)
     WHERE w.job_id = chosen.job_id;
    UPDATE pgqueue_jobs AS j
       SET status = 'cancelled', completed_at = now(), held = false,
           last_error = CASE WHEN chosen.cause = chosen.root
               THEN format('Cancelled: job %s, which it depends on, is %s.',
                           chosen.root, root.status)
               ELSE format('Cancelled: job %s, which it depends on, was cancelled '
                           'because job %s is %s.', chosen.cause, chosen.root, root.status)
           END
      FROM unnest(v_jobs, v_causes, v_roots) AS chosen(job_id, cause, root)
      JOIN pgqueue_jobs AS root ON root.id = chosen.root
     WHERE j.id = chosen.job_id AND j.status = 'waiting';
END
$$;

-- Version 1's, with the lookup of edges by index (see the top of this file).
CREATE OR REPLACE FUNCTION pgqueue_settle_jobs(p_ids uuid[], p_old text[], p_new text[])
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
         CROSS JOIN LATERAL (
            SELECT e.job_id, e.on_failure
              FROM pgqueue_job_dependencies AS e
             WHERE e.dependency_id = s.id
            OFFSET 0  -- looked up one job at a time, through the index
         ) AS d
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
