-- Per-key limits, version 2: as version 1 (key_limits_v1.sql), for per-key rates too.
-- The same two functions, with the same signatures, replaced in place.
--
-- Version 1 kept a key's due backlog beyond its concurrency limit out of the claim
-- index (held), so that a claim walked a few rows of a key at its limit, never its
-- whole backlog. A key under a per-key rate (@job(rate_limit=..., rate_key=...)) kept
-- all its jobs visible: a claim skipped a key at its rate row by row, and a tenant with
-- a hundred thousand due jobs at its rate cost every claim a walk over all of them.
-- Now a key's visible places are the least of its concurrency limit and its rate's
-- jobs per window, at most 100 (pgqueue_key_places): a window holds no more starts
-- than that, and a blocked key costs a claim that many rows at most.
--
-- * Places of a job type: NULL when it has no per-key limit of either kind (its held
--   jobs, if any, are all released).
-- * A release looks at a key only when it has held jobs: claims under per-key rates
--   call it for every key they took jobs of, and most have none.
--
-- Everything else is version 1's: admission by enqueue(), release by the claim and by
-- cancel(), the sweep from every worker's recovery loop, "due" at clock_timestamp().

-- Visible places of each job type with a per-key limit.
CREATE FUNCTION pgqueue_key_places()
RETURNS TABLE (job_type text, places integer)
LANGUAGE sql STABLE AS $$
    SELECT name, min(places)::integer
      FROM (
        SELECT name, max_running AS places FROM pgqueue_limits WHERE scope = 'key'
        UNION ALL
        SELECT name, least(max_jobs, 100) FROM pgqueue_rate_limits WHERE scope = 'key'
      ) AS limited
     GROUP BY name
$$;

CREATE OR REPLACE FUNCTION pgqueue_release_held_keys(p_job_types text[], p_keys text[])
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
    v_released integer;
BEGIN
    UPDATE pgqueue_jobs AS jobs SET held = false
      FROM (
        SELECT next.id
          FROM (SELECT DISTINCT * FROM unnest(p_job_types, p_keys)) AS k(job_type, key)
          LEFT JOIN pgqueue_key_places() AS p ON p.job_type = k.job_type
          CROSS JOIN LATERAL (
            SELECT count(*) AS jobs FROM (
                SELECT 1 FROM pgqueue_jobs AS v
                 WHERE v.job_type = k.job_type AND v.concurrency_key = k.key
                   AND v.status = 'pending' AND NOT v.held AND v.run_at <= v_now
                 LIMIT p.places) AS visible_jobs
          ) AS visible
          CROSS JOIN LATERAL (
            SELECT h.id FROM pgqueue_jobs AS h
             WHERE h.job_type = k.job_type AND h.concurrency_key = k.key
               AND h.status = 'pending' AND h.held
             ORDER BY h.priority DESC, h.run_at, h.created_at
             LIMIT CASE WHEN p.places IS NULL THEN NULL
                        ELSE greatest(p.places - visible.jobs, 0) END
             FOR UPDATE SKIP LOCKED
          ) AS next
         WHERE EXISTS (SELECT 1 FROM pgqueue_jobs AS h
                        WHERE h.job_type = k.job_type AND h.concurrency_key = k.key
                          AND h.status = 'pending' AND h.held)
      ) AS released
     WHERE jobs.id = released.id;
    GET DIAGNOSTICS v_released = ROW_COUNT;
    RETURN v_released;
END;
$$;

CREATE OR REPLACE FUNCTION pgqueue_release_held_jobs() RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_excess uuid[];
BEGIN
    SELECT array_agg(ranked.id) INTO v_excess
      FROM (
        SELECT v.id, p.places,
               row_number() OVER (PARTITION BY v.job_type, v.concurrency_key
                                  ORDER BY v.priority DESC, v.run_at, v.created_at) AS rank
          FROM pgqueue_jobs AS v
          JOIN pgqueue_key_places() AS p ON p.job_type = v.job_type
         WHERE v.status = 'pending' AND NOT v.held AND v.concurrency_key IS NOT NULL
           AND v.run_at <= clock_timestamp()
      ) AS ranked
     WHERE ranked.rank > ranked.places;
    -- SKIP LOCKED: a job a claimer is taking, or one that an enqueue inside a long
    -- transaction released, is left alone; the sweep never waits (it runs in the
    -- worker's heartbeat thread).
    UPDATE pgqueue_jobs AS jobs SET held = true
     WHERE jobs.id IN (SELECT id FROM pgqueue_jobs
                        WHERE id = ANY (COALESCE(v_excess, '{}'))
                          AND status = 'pending' AND NOT held
                          FOR UPDATE SKIP LOCKED);
    RETURN pgqueue_release_held_keys(array_agg(job_type), array_agg(concurrency_key))
      FROM (SELECT DISTINCT job_type, concurrency_key FROM pgqueue_jobs
             WHERE status = 'pending' AND held AND concurrency_key IS NOT NULL) AS held_keys;
END;
$$;
