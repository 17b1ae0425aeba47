-- Per-key concurrency limits, version 1: which pending jobs of a key the claim may see.
--
-- A job type declared with @job(concurrency=N, concurrency_key=...) stores each job's
-- key in pgqueue_jobs.concurrency_key and its limit N in pgqueue_limits (scope 'key',
-- name: the job type). claim_job_batch (version 4) never lets more than N jobs of one
-- key be claimed or running: it counts them under the key's advisory lock. These
-- functions keep that count cheap to reach for every key, however long one key's
-- backlog: of a key's due pending jobs, only about N are visible to the claim; the
-- rest are "held" (held = true), outside idx_jobs_claimable, which covers
-- status = 'pending' AND NOT held. A claim therefore walks at most a few rows of a key
-- at its limit, never its whole backlog, and other keys' jobs are reached at once.
--
-- Holding is only an optimisation of the walk; the limit is enforced by the claim.
-- A wrong decision here can delay a job (until the sweep below), never exceed a limit.
-- "Due" here is run_at <= clock_timestamp(), read once per call: the time of the
-- decision, not the start of its transaction (a job that an UPDATE inside a long
-- transaction makes due at statement_timestamp() is due, not scheduled for later).
--
-- * Admission (BEFORE INSERT, and BEFORE UPDATE when a job comes back to pending): a
--   due job is held when its key already has N visible due jobs. A job scheduled for
--   later is never held, so a key's delayed jobs never stand in the way of its due ones.
-- * Release (when a visible pending job of a key is claimed, cancelled or deleted): held
--   jobs of the key, in claim order, become visible until it has N visible due jobs.
--   claim_job_batch releases once for all the keys of a batch; triggers do it for the
--   other ways out of pending.
-- * Sweep (pgqueue_release_held_jobs, from every worker's recovery loop): releases what
--   a race between an insert and a release left held, and every held job of a job type
--   whose key limit is gone.

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

CREATE FUNCTION pgqueue_admit_keyed_job() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_limit integer;
    v_visible integer;
    v_now timestamptz := clock_timestamp();
BEGIN
    IF NEW.status <> 'pending' THEN
        NEW.held := false;  -- a held job that is cancelled is held no more
        RETURN NEW;
    END IF;
    NEW.held := false;
    IF NEW.run_at > v_now THEN
        RETURN NEW;
    END IF;
    SELECT max_running INTO v_limit
      FROM pgqueue_limits WHERE scope = 'key' AND name = NEW.job_type;
    IF v_limit IS NULL THEN
        RETURN NEW;
    END IF;
    -- Rows inserted earlier by the same statement (a COPY) are counted too.
    SELECT count(*) INTO v_visible FROM (
        SELECT 1 FROM pgqueue_jobs
         WHERE job_type = NEW.job_type AND concurrency_key = NEW.concurrency_key
           AND status = 'pending' AND NOT held AND run_at <= v_now
         LIMIT v_limit) AS visible;
    NEW.held := v_visible >= v_limit;
    RETURN NEW;
END;
$$;

CREATE FUNCTION pgqueue_release_after_keyed_job() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgqueue_release_held_keys(ARRAY[OLD.job_type], ARRAY[OLD.concurrency_key]);
    RETURN NULL;
END;
$$;

-- Every held job of a key with room, or of a job type with no key limit left, is
-- released; returns how many. Safe to run from many sessions at once.
CREATE FUNCTION pgqueue_release_held_jobs() RETURNS integer
LANGUAGE sql AS $$
    SELECT pgqueue_release_held_keys(array_agg(job_type), array_agg(concurrency_key))
      FROM (SELECT DISTINCT job_type, concurrency_key FROM pgqueue_jobs
             WHERE status = 'pending' AND held AND concurrency_key IS NOT NULL) AS held_keys;
$$;

-- The WHEN clauses keep jobs without a key free of any trigger call.
CREATE TRIGGER pgqueue_jobs_admit
    BEFORE INSERT ON pgqueue_jobs
    FOR EACH ROW WHEN (NEW.concurrency_key IS NOT NULL)
    EXECUTE FUNCTION pgqueue_admit_keyed_job();

CREATE TRIGGER pgqueue_jobs_admit_again
    BEFORE UPDATE OF status ON pgqueue_jobs
    FOR EACH ROW WHEN (NEW.concurrency_key IS NOT NULL AND OLD.status <> NEW.status
                       AND (NEW.status = 'pending' OR OLD.held))
    EXECUTE FUNCTION pgqueue_admit_keyed_job();

-- Claims (to claimed or running) release once per claim, for all their keys: not here.
CREATE TRIGGER pgqueue_jobs_release_after_update
    AFTER UPDATE OF status ON pgqueue_jobs
    FOR EACH ROW WHEN (OLD.concurrency_key IS NOT NULL AND OLD.status = 'pending'
                       AND NEW.status NOT IN ('pending', 'claimed', 'running')
                       AND NOT OLD.held)
    EXECUTE FUNCTION pgqueue_release_after_keyed_job();

CREATE TRIGGER pgqueue_jobs_release_after_delete
    AFTER DELETE ON pgqueue_jobs
    FOR EACH ROW WHEN (OLD.concurrency_key IS NOT NULL AND OLD.status = 'pending'
                       AND NOT OLD.held)
    EXECUTE FUNCTION pgqueue_release_after_keyed_job();
