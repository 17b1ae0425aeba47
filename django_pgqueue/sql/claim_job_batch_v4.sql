-- claim_job_batch, version 4: as version 3, with per-key concurrency limits and held jobs.
--
-- * Only visible pending jobs are claimed: status = 'pending' AND NOT held, the predicate
--   of idx_jobs_claimable (rebuilt by the same migration). Held jobs are a key's backlog
--   beyond its limit (key_limits_v1.sql); the walk never passes over them.
-- * Per-key limits (pgqueue_limits rows of scope 'key', name: the job type): at most
--   max_running jobs of one (job_type, concurrency_key) claimed or running at once. Keys
--   at their limit are left out of the walk; the candidates of the others are ranked
--   per key under the key's advisory lock, as queues and job types are. Once per pass,
--   the keys of the jobs claimed release their held jobs (pgqueue_release_held_keys).
-- * Advisory locks of every limit a batch touches are taken in one order (scope, then
--   name), so claimers cannot deadlock; a claimer waits only for claimers of the same
--   queue, job type or key.
--
-- * jit = off. enable_sort = off prices every sort at 10^10, far above jit_above_cost, so
--   on a server with JIT (PostgreSQL's default where LLVM is installed) each statement
--   that sorts, such as the ranking under limits, was compiled first: 100-500 ms for a
--   claim that runs in a millisecond. Claims of limited jobs ran at 100 jobs/s.
--
-- Everything else is version 3's. Same signature: CREATE OR REPLACE swaps the body.
CREATE OR REPLACE FUNCTION claim_job_batch(
    p_worker_id text,
    p_job_types text[],
    p_batch_size integer DEFAULT 10,
    p_queues text[] DEFAULT NULL,
    p_start boolean DEFAULT false
) RETURNS SETOF pgqueue_jobs
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan
SET enable_sort = off
SET jit = off
AS $$
DECLARE
    v_paused text[];
    v_full_queues text[];
    v_full_types text[];
    v_full_keys text[];
    v_candidates uuid[];
    v_keep uuid[];
    v_passed_over uuid[];
    v_limited boolean;
    v_keyed boolean;
    v_wanted integer := p_batch_size;
    v_limit record;
BEGIN
    IF p_worker_id IS NULL OR p_worker_id = '' THEN
        RAISE EXCEPTION 'claim_job_batch: p_worker_id must be a non-empty string'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_batch_size IS NULL OR p_batch_size < 1 OR p_batch_size > 10000 THEN
        RAISE EXCEPTION 'claim_job_batch: p_batch_size must be between 1 and 10000, got %',
            p_batch_size
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    SELECT array_agg(name) INTO v_paused FROM pgqueue_queues WHERE paused_at IS NOT NULL;

    v_limited := EXISTS (SELECT 1 FROM pgqueue_limits);
    v_keyed := v_limited AND EXISTS (SELECT 1 FROM pgqueue_limits WHERE scope = 'key');
    -- A key is named job_type, newline, concurrency_key: job types have no newline.

    -- Without limits, one walk claims the batch. With limits, at most three: a walk
    -- whose limited candidates did not all fit is followed by another (now skipping the
    -- limits that filled up) to fill the batch.
    FOR pass IN 1..3 LOOP
        IF v_limited THEN
            SELECT array_agg(l.name) FILTER (WHERE l.scope = 'queue'),
                   array_agg(l.name) FILTER (WHERE l.scope = 'job_type')
              INTO v_full_queues, v_full_types
              FROM pgqueue_limits AS l
             WHERE l.max_running <= (
                    SELECT count(*)
                      FROM pgqueue_jobs AS j
                     WHERE j.status IN ('claimed', 'running')
                       AND CASE l.scope WHEN 'queue' THEN j.queue ELSE j.job_type END = l.name)
               AND l.scope IN ('queue', 'job_type');

            SELECT array_agg(full_key.name) INTO v_full_keys
              FROM (
                SELECT j.job_type || E'\n' || j.concurrency_key AS name
                  FROM pgqueue_jobs AS j
                  JOIN pgqueue_limits AS l ON l.scope = 'key' AND l.name = j.job_type
                 WHERE j.status IN ('claimed', 'running') AND j.concurrency_key IS NOT NULL
                 GROUP BY j.job_type, j.concurrency_key, l.max_running
                HAVING count(*) >= l.max_running
              ) AS full_key;
        END IF;

        SELECT array_agg(due.id) INTO v_candidates
          FROM (
            SELECT id
              FROM pgqueue_jobs
             WHERE status = 'pending'
               AND NOT held
               AND run_at <= now()
               AND (p_queues IS NULL OR queue = ANY (p_queues))
               AND (p_job_types IS NULL OR job_type = ANY (p_job_types))
               AND (v_paused IS NULL OR queue <> ALL (v_paused))
               AND (v_full_queues IS NULL OR queue <> ALL (v_full_queues))
               AND (v_full_types IS NULL OR job_type <> ALL (v_full_types))
               AND (v_full_keys IS NULL OR concurrency_key IS NULL
                    OR job_type || E'\n' || concurrency_key <> ALL (v_full_keys))
               AND (v_passed_over IS NULL OR id <> ALL (v_passed_over))
             ORDER BY priority DESC, run_at, created_at
             LIMIT v_wanted
             FOR UPDATE SKIP LOCKED
          ) AS due;
        EXIT WHEN v_candidates IS NULL;

        v_keep := v_candidates;
        IF v_limited THEN
            FOR v_limit IN
                SELECT DISTINCT l.scope,
                       CASE l.scope WHEN 'key' THEN j.job_type || E'\n' || j.concurrency_key
                                    ELSE l.name END AS name
                  FROM pgqueue_limits AS l
                  JOIN pgqueue_jobs AS j
                    ON j.id = ANY (v_candidates)
                   AND CASE l.scope WHEN 'queue' THEN j.queue ELSE j.job_type END = l.name
                 WHERE l.scope <> 'key' OR j.concurrency_key IS NOT NULL
                 ORDER BY 1, 2
            LOOP
                PERFORM pg_advisory_xact_lock(
                    hashtextextended('pgqueue_limit:' || v_limit.scope || ':' || v_limit.name, 0));
            END LOOP;

            -- Under the locks: keep candidates, in claim order within each limit, while
            -- the limit has room. Ranking per queue, job type and key separately can leave
            -- a little room unused in this pass; it never lets a limit be exceeded.
            SELECT array_agg(ranked.id) INTO v_keep
              FROM (
                SELECT c.id, c.queue, c.job_type,
                       row_number() OVER (PARTITION BY c.queue
                                          ORDER BY c.priority DESC, c.run_at, c.created_at) AS queue_rank,
                       row_number() OVER (PARTITION BY c.job_type
                                          ORDER BY c.priority DESC, c.run_at, c.created_at) AS type_rank,
                       c.concurrency_key,
                       row_number() OVER (PARTITION BY c.job_type, c.concurrency_key
                                          ORDER BY c.priority DESC, c.run_at, c.created_at) AS key_rank
                  FROM pgqueue_jobs AS c
                 WHERE c.id = ANY (v_candidates)
              ) AS ranked
              LEFT JOIN pgqueue_limits AS ql ON ql.scope = 'queue' AND ql.name = ranked.queue
              LEFT JOIN pgqueue_limits AS tl
                     ON tl.scope = 'job_type' AND tl.name = ranked.job_type
              LEFT JOIN pgqueue_limits AS kl
                     ON kl.scope = 'key' AND kl.name = ranked.job_type
                    AND ranked.concurrency_key IS NOT NULL
             WHERE (ql.name IS NULL OR ranked.queue_rank <= ql.max_running - (
                        SELECT count(*) FROM pgqueue_jobs AS j
                         WHERE j.status IN ('claimed', 'running') AND j.queue = ranked.queue))
               AND (tl.name IS NULL OR ranked.type_rank <= tl.max_running - (
                        SELECT count(*) FROM pgqueue_jobs AS j
                         WHERE j.status IN ('claimed', 'running')
                           AND j.job_type = ranked.job_type))
               AND (kl.name IS NULL OR ranked.key_rank <= kl.max_running - (
                        SELECT count(*) FROM pgqueue_jobs AS j
                         WHERE j.status IN ('claimed', 'running')
                           AND j.job_type = ranked.job_type
                           AND j.concurrency_key = ranked.concurrency_key));
        END IF;

        RETURN QUERY
        UPDATE pgqueue_jobs AS jobs
           SET status = CASE WHEN p_start THEN 'running' ELSE 'claimed' END,
               worker_id = p_worker_id,
               claimed_at = now(),
               started_at = CASE WHEN p_start THEN now() ELSE jobs.started_at END,
               heartbeat_at = now(),
               attempts = jobs.attempts + 1,
               worker_ids = jobs.worker_ids || to_jsonb(p_worker_id)
         WHERE jobs.id = ANY (COALESCE(v_keep, '{}'))
        RETURNING jobs.*;

        -- The claimed jobs of keys leave room for their keys' held jobs (key_limits_v1.sql).
        IF v_keyed AND v_keep IS NOT NULL THEN
            PERFORM pgqueue_release_held_keys(array_agg(claimed.job_type),
                                              array_agg(claimed.concurrency_key))
               FROM pgqueue_jobs AS claimed
              WHERE claimed.id = ANY (v_keep) AND claimed.concurrency_key IS NOT NULL
             HAVING count(*) > 0;
        END IF;

        v_wanted := v_wanted - COALESCE(cardinality(v_keep), 0);
        EXIT WHEN v_wanted <= 0
               OR COALESCE(cardinality(v_keep), 0) = cardinality(v_candidates);
        v_passed_over := COALESCE(v_passed_over, '{}')
            || ARRAY(SELECT unnest(v_candidates) EXCEPT SELECT unnest(COALESCE(v_keep, '{}')));
    END LOOP;
END;
$$;
