-- Rate limits, version 2: when a worker should claim next. As version 1, but per-key
-- rates are read from the marks claim_job_batch (version 6) leaves on the row of a claim
-- that filled a key's window (full_until, idx_rate_starts_full), not by summing every
-- key's recent starts: with a thousand keys at 10 a second, ten thousand rows each call.
--
-- Returns seconds (0 when a limit has room already), or NULL when no limit of these job
-- types and queues is full. p_job_types and p_queues: as claim_job_batch's (NULL: all).
--
-- Call it in the claim's transaction: "full" is judged at the start of the transaction,
-- now(), not at the moment of the call. A window that was full when the claim looked and
-- got room a moment later (its oldest claim left it in between) must not read as "not
-- full": the worker would wait for its next poll, and the room would go unused until then.
-- Judged at now(), such a window is full, and the wait is 0.
CREATE OR REPLACE FUNCTION pgqueue_rate_limit_wait(p_job_types text[], p_queues text[])
RETURNS double precision
LANGUAGE sql STABLE AS $$
    SELECT min(greatest(extract(epoch FROM full_window.until - clock_timestamp()), 0))
      FROM (
        -- Queues and job types: one window each, with room once its oldest start leaves.
        SELECT window_.oldest + r.period_seconds * interval '1 second' AS until
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
        -- Per-key rates: the windows a claim filled, until they have room (rows are
        -- named job_type, newline, key).
        SELECT s.full_until
          FROM pgqueue_rate_starts AS s
          JOIN pgqueue_rate_limits AS r
            ON r.scope = 'key' AND r.name = split_part(s.name, E'\n', 1)
         WHERE s.full_until > now() AND s.scope = 'key'
           AND (p_job_types IS NULL OR r.name = ANY (p_job_types))
      ) AS full_window
$$;
