-- Rate limits, version 1: when a worker should claim next.
--
-- claim_job_batch (version 5) enforces rate limits: a job over its limit stays pending.
-- A worker whose claim came back short asks this function how long until the first
-- full limit it may claim jobs of has room again, and claims then, instead of at its
-- next poll: a window's room opens when its oldest claim leaves it.
--
-- Returns seconds (0 when a limit has room already), or NULL when no limit of these job
-- types and queues is full. p_job_types and p_queues: as claim_job_batch's (NULL: all).
CREATE FUNCTION pgqueue_rate_limit_wait(p_job_types text[], p_queues text[])
RETURNS double precision
LANGUAGE sql STABLE AS $$
    SELECT min(greatest(extract(epoch FROM
               window_.oldest + r.period_seconds * interval '1 second' - clock_timestamp()), 0))
      FROM pgqueue_rate_limits AS r
     CROSS JOIN LATERAL (
        SELECT min(s.started_at) AS oldest, sum(s.jobs) AS jobs
          FROM pgqueue_rate_starts AS s
         WHERE s.scope = r.scope AND s.name = r.name
           AND s.started_at > clock_timestamp() - r.period_seconds * interval '1 second'
     ) AS window_
     WHERE window_.jobs >= r.max_jobs
       AND CASE r.scope WHEN 'queue' THEN p_queues IS NULL OR r.name = ANY (p_queues)
                        ELSE p_job_types IS NULL OR r.name = ANY (p_job_types) END
$$;
