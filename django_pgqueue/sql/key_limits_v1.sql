-- Per-key concurrency limits, version 1: which pending jobs of a key the claim may see.
--
-- A job type declared with @job(concurrency=N, concurrency_key=...) stores each job's
-- key in pgqueue_jobs.concurrency_key and its limit N in pgqueue_limits (scope 'key',
-- name: the job type). claim_job_batch (version 4) never lets more than N jobs of one
-- key be claimed or running: it counts them under the key's advisory lock. What this
-- file adds keeps that cheap for every key, however long one key's backlog: of a key's
-- due pending jobs, only about N are visible to the claim; the rest are "held"
-- (held = true), outside idx_jobs_claimable, which covers status = 'pending' AND NOT
-- held. A claim therefore walks at most a few rows of a key at its limit, never its
-- whole backlog, and other keys' jobs are reached at once.
--
-- Holding is only an optimisation of the walk; the limit is enforced by the claim.
-- A wrong decision here can delay a job (until the sweep below), never exceed a limit.
--
-- * Admission: enqueue() inserts the due jobs with a key held, then, in the same
--   transaction, releases their keys (pgqueue_release_held_keys). A job scheduled for
--   later is inserted visible: only due jobs fill a key's visible places, and holding it
--   would leave it waiting for a release after it comes due.
-- * Release: of each key, held jobs become visible in claim order until the key has N
--   visible due jobs. The claim does it once per pass for the keys it took jobs of;
--   JobQuerySet.cancel() for the keys of the jobs it cancelled.
-- * Sweep (pgqueue_release_held_jobs, from every worker's recovery loop): holds the
--   excess of keys whose delayed jobs came due together, and releases what a race
--   between an enqueue and a claim left held, what a job deleted or cancelled in SQL
--   left room for, and every held job of a job type whose key limit is gone.
--
-- There are no triggers: a BEFORE INSERT row trigger turns COPY's multi-row inserts into
-- single-row ones, and a BEFORE UPDATE row trigger locks each updated row first (a WAL
-- record per row): every job would pay for them, with a key or not.
--
-- "Due" here is run_at <= clock_timestamp(): the time of the decision, not the start of
-- its transaction.

-- Releases held jobs of the keys (p_job_types[i], p_keys[i]): of each, in claim order,
-- until it has as many visible due jobs as its limit, or all of them when its job type
-- has no per-key limit (left). Returns how many were released. One statement for any
-- number of keys: the claim calls it once for all the keys it took jobs of.
CREATE FUNCTION pgqueue_release_held_keys(p_job_types text[], p_keys text[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
    v_released integer;
BEGIN
    UPDATE pgqueue_jobs AS jobs SET held = false
      FROM (
        SELECT next.id
          FROM (SELECT DISTINCT * FROM unnest(p_job_types, p_keys)) AS k(job_type, key)
          LEFT JOIN pgqueue_limits AS l ON l.scope = 'key' AND l.name = k.job_type
          CROSS JOIN LATERAL (
            SELECT count(*) AS jobs FROM (
                SELECT 1 FROM pgqueue_jobs AS v
                 WHERE v.job_type = k.job_type AND v.concurrency_key = k.key
                   AND v.status = 'pending' AND NOT v.held AND v.run_at <= v_now
                 LIMIT l.max_running) AS visible_jobs
          ) AS visible
          CROSS JOIN LATERAL (
            SELECT h.id FROM pgqueue_jobs AS h
             WHERE h.job_type = k.job_type AND h.concurrency_key = k.key
               AND h.status = 'pending' AND h.held
             ORDER BY h.priority DESC, h.run_at, h.created_at
             LIMIT CASE WHEN l.max_running IS NULL THEN NULL
                        ELSE greatest(l.max_running - visible.jobs, 0) END
             FOR UPDATE SKIP LOCKED
          ) AS next
      ) AS released
     WHERE jobs.id = released.id;
    GET DIAGNOSTICS v_released = ROW_COUNT;
    RETURN v_released;
END;
$$;

-- The sweep. First the keys with more visible due jobs than their limit (jobs scheduled
-- for later are not held, and come due together) hold the excess, last in claim order;
-- then every held job of a key with room, or of a job type with no key limit left, is
-- released. Returns how many were released. Safe to run from many sessions at once.
CREATE FUNCTION pgqueue_release_held_jobs() RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_excess uuid[];
BEGIN
    SELECT array_agg(ranked.id) INTO v_excess
      FROM (
        SELECT v.id, l.max_running,
               row_number() OVER (PARTITION BY v.job_type, v.concurrency_key
                                  ORDER BY v.priority DESC, v.run_at, v.created_at) AS rank
          FROM pgqueue_jobs AS v
          JOIN pgqueue_limits AS l ON l.scope = 'key' AND l.name = v.job_type
         WHERE v.status = 'pending' AND NOT v.held AND v.concurrency_key IS NOT NULL
           AND v.run_at <= clock_timestamp()
      ) AS ranked
     WHERE ranked.rank > ranked.max_running;
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
