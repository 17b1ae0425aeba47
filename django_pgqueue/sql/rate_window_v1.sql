-- Rate limits' windows, defined once each: which windows count a job, what a window
-- holds, and which limit a window belongs to. Read by the claim (claim_job_batch_v9.sql),
-- pgqueue_rate_limit_wait() (rate_limits_v3.sql), pgqueue_rate_hand_back()
-- (rate_hand_back_v2.sql) and the states of the rate limits that Python and the admin
-- show (rate_limits.py).
--
-- Each is a SQL function of one SELECT or expression, neither strict nor volatile: the
-- planner inlines it into the query that calls it, so that each caller's plan is the
-- one that the same SQL written in its place would get. An argument that is volatile
-- (clock_timestamp()) would keep it from being inlined: callers pass a variable or a
-- stable clock.

-- The rate limits that count a job of this queue, job type and concurrency key, each
-- with the name of the window the job counts in: the limit's own name, or for a
-- per-key rate the job type, newline, key (a job without a key is not counted by it).
CREATE FUNCTION pgqueue_rate_limits_of(
    p_queue text,
    p_job_type text,
    p_concurrency_key text
) RETURNS TABLE (scope text, name text, window_name text, max_jobs integer,
                 period_seconds integer)
LANGUAGE sql STABLE AS $$
    SELECT r.scope::text, r.name::text,
           CASE r.scope WHEN 'key' THEN p_job_type || E'\n' || p_concurrency_key
                        ELSE r.name END::text,
           r.max_jobs, r.period_seconds
      FROM pgqueue_rate_limits AS r
     WHERE CASE r.scope WHEN 'queue' THEN p_queue ELSE p_job_type END = r.name
       AND (r.scope <> 'key' OR p_concurrency_key IS NOT NULL)
$$;

-- The name of the rate limit whose window is named p_window_name (the inverse of
-- pgqueue_rate_limits_of()'s window_name).
CREATE FUNCTION pgqueue_rate_limit_name(p_scope text, p_window_name text)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_scope = 'key' THEN split_part(p_window_name, E'\n', 1)
                ELSE p_window_name END
$$;

-- What a window holds: the starts logged under (p_scope, p_name) in the p_period_seconds
-- before p_at: how many jobs, the oldest of them, and, when they are p_max_jobs or more,
-- the moment the window has room again (room_at: its oldest start leaves it then); NULL
-- while it has room.
CREATE FUNCTION pgqueue_rate_window(
    p_scope text,
    p_name text,
    p_max_jobs integer,
    p_period_seconds integer,
    p_at timestamptz
) RETURNS TABLE (jobs bigint, oldest timestamptz, room_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT COALESCE(sum(s.jobs), 0),
           min(s.started_at),
           CASE WHEN COALESCE(sum(s.jobs), 0) >= p_max_jobs
                THEN min(s.started_at) + p_period_seconds * interval '1 second' END
      FROM pgqueue_rate_starts AS s
     WHERE s.scope = p_scope AND s.name = p_name
       AND s.started_at > p_at - p_period_seconds * interval '1 second'
$$;
