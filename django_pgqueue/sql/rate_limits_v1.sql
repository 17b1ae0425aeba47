-- Rate limits, version 1: when a worker should claim next.
--
-- claim_job_batch (version 5) enforces rate limits: a job over its limit stays pending.
-- A worker whose claim came back short asks this function how long until the first
-- full limit it may claim jobs of has room again, and claims then, instead of at its
-- next poll: a window's room opens when its oldest claim leaves it.
--
-- Returns seconds (0 when a limit has room already), or NULL when no limit of these job
-- types and queues is full. p_job_types and p_queues: as claim_job_batch's (NULL: all).
--
-- Call it in the claim's transaction: "full" is judged at the start of the transaction,
-- now(), not at the moment of the call. A window that was full when the claim looked and
-- got room a moment later (its oldest claim left it in between) must not read as "not
-- full": the worker would wait for its next poll, and the room would go unused until then.
-- Judged at now(), such a window is full, and the wait is 0.
CREATE FUNCTION pgqueue_rate_limit_wait(p_job_types text[], p_queues text[])
RETURNS double precision
LANGUAGE sql STABLE AS $$
    SELECT min(greatest(extract(epoch FROM
               full_window.oldest + full_window.period - clock_timestamp()), 0))
      FROM (
        -- Queues and job types: one window each.
        SELECT window_.oldest, r.period_seconds * interval '1 second' AS period
          FROM pgqueue_rate_limits AS r
         CROSS JOIN LATERAL (
            SELECT min(s.started_at) AS oldest, sum(s.jobs) AS jobs
              FROM pgqueue_rate_starts AS s
             WHERE s.scope = r.scope AND s.name = r.name
               AND s.started_at > now() - r.period_seconds * interval '1 second'
         ) AS window_
         WHERE r.scope <> 'key'
           AND window_.jobs >= r.max_jobs
           AND CASE r.scope WHEN 'queue' THEN p_queues IS NULL OR r.name = ANY (p_queues)
                            ELSE p_job_types IS NULL OR r.name = ANY (p_job_types) END
        UNION ALL
        -- Per-key rates: a window for each key (its rows are named job_type, newline, key).
        SELECT min(s.started_at), r.period_seconds * interval '1 second'
          FROM pgqueue_rate_limits AS r
          JOIN pgqueue_rate_starts AS s
            ON s.scope = 'key' AND split_part(s.name, E'\n', 1) = r.name
           AND s.started_at > now() - r.period_seconds * interval '1 second'
         WHERE r.scope = 'key'
           AND (p_job_types IS NULL OR r.name = ANY (p_job_types))
         GROUP BY s.name, r.period_seconds, r.max_jobs
        HAVING sum(s.jobs) >= r.max_jobs
      ) AS full_window
$$;
