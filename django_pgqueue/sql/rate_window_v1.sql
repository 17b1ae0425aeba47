-- What a rate limit's window holds: the one definition of it, read by the claim
-- (claim_job_batch_v9.sql), by pgqueue_rate_limit_wait() (rate_limits_v3.sql) and by the
-- states of the rate limits that Python and the admin show (rate_limits.py).
--
-- The starts logged under (p_scope, p_name) in the p_period_seconds before p_at: how
-- many jobs, the oldest of them, and, when they are p_max_jobs or more, the moment the
-- window has room again (room_at: its oldest start leaves it then); NULL while it has
-- room. A per-key rate has a window for each key, whose rows are named job type,
-- newline, key.
--
-- One SELECT in a set-returning SQL function, neither strict nor volatile: the planner
-- inlines it into the query that calls it (in FROM or LATERAL), so that each caller's
-- plan is the one that the same SELECT written in its place would get. An argument that
-- is volatile (clock_timestamp()) would keep it from being inlined: callers pass a
-- variable or a stable clock.
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
