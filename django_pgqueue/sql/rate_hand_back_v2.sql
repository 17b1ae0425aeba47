-- pgqueue_rate_hand_back, version 2: as version 1 (rate_hand_back_v1.sql, which explains
-- it; the same signature and results), with the windows that counted each job read from
-- pgqueue_rate_limits_of() (rate_window_v1.sql), the one definition of which windows
-- count a job, which the claim that counted them reads too.
CREATE OR REPLACE FUNCTION pgqueue_rate_hand_back(p_job_ids uuid[], p_worker_id text)
RETURNS integer
LANGUAGE sql AS $$
    WITH back AS (
        SELECT r.scope, r.window_name AS name, j.started_at, count(*)::integer AS jobs
          FROM pgqueue_jobs AS j
         CROSS JOIN LATERAL pgqueue_rate_limits_of(j.queue, j.job_type,
                                                   j.concurrency_key) AS r
         WHERE j.id = ANY (p_job_ids)
           AND j.worker_id = p_worker_id
           AND j.status IN ('claimed', 'running')
           AND j.started_at IS NOT NULL
         GROUP BY 1, 2, 3
    ),
    locked AS (
        SELECT s.scope, s.name, s.started_at, COALESCE(b.jobs, 0) AS jobs
          FROM pgqueue_rate_starts AS s
          LEFT JOIN back AS b
            ON b.scope = s.scope AND b.name = s.name AND b.started_at = s.started_at
         WHERE (s.scope, s.name) IN (SELECT scope, name FROM back)
           AND (b.jobs IS NOT NULL OR s.full_until > now())
         ORDER BY s.scope, s.name, s.started_at
           FOR UPDATE OF s
    ),
    taken_back AS (
        UPDATE pgqueue_rate_starts AS s
           SET jobs = greatest(s.jobs - locked.jobs, 0),
               full_until = NULL
          FROM locked
         WHERE s.scope = locked.scope AND s.name = locked.name
           AND s.started_at = locked.started_at
        RETURNING locked.jobs
    )
    SELECT COALESCE(sum(jobs), 0)::integer FROM taken_back
$$;
