-- Rate limits, version 3: when a worker should claim next. As version 2
-- (rate_limits_v2.sql, which explains the function), but a queue's or job type's
-- window is read from pgqueue_rate_window() (rate_window_v1.sql), the one definition of
-- what a window holds and of when a full one has room again, and a key's mark is tied
-- to its limit by pgqueue_rate_limit_name(): the claim reads both too.
--
-- Returns seconds (0 when a limit has room already), or NULL when no limit of these job
-- types and queues is full. Call it in the claim's transaction: "full" is judged at now().
CREATE OR REPLACE FUNCTION pgqueue_rate_limit_wait(p_job_types text[], p_queues text[])
RETURNS double precision
LANGUAGE sql STABLE AS $$
    SELECT min(greatest(extract(epoch FROM full_window.until - clock_timestamp()), 0))
      FROM (
        -- Queues and job types: one window each.
        SELECT w.room_at AS until
          FROM pgqueue_rate_limits AS r
         CROSS JOIN LATERAL pgqueue_rate_window(r.scope, r.name, r.max_jobs, r.period_seconds,
                                                now()) AS w
         WHERE r.scope <> 'key'
           AND w.room_at IS NOT NULL
           AND CASE r.scope WHEN 'queue' THEN p_queues IS NULL OR r.name = ANY (p_queues)
                            ELSE p_job_types IS NULL OR r.name = ANY (p_job_types) END
        UNION ALL
        -- Per-key rates: the windows a claim filled, until they have room (rows are
        -- named job_type, newline, key).
        SELECT s.full_until
          FROM pgqueue_rate_starts AS s
          JOIN pgqueue_rate_limits AS r
            ON r.scope = 'key' AND r.name = pgqueue_rate_limit_name(s.scope, s.name)
         WHERE s.full_until > now() AND s.scope = 'key'
           AND (p_job_types IS NULL OR r.name = ANY (p_job_types))
      ) AS full_window
$$;
