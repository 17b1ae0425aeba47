-- claim_job_batch, version 2: as version 1, and it also
--   * skips paused queues (pgqueue_queues.paused_at is set), and
--   * keeps every concurrency limit of pgqueue_limits: at most max_running jobs of the
--     queue or job type claimed or running at once, across all workers.
--
-- Without limits the claim is version 1's walk (one ordered walk of idx_jobs_claimable
-- that stops after p_batch_size rows, SKIP LOCKED) with the paused queues filtered
-- inside the index, then an update of the rows it locked.
--
-- With limits, the walk first leaves out the queues and job types already at their
-- limit (an unlocked count: only an optimisation). When the rows it locked include
-- limited ones, the function takes a transaction-scoped advisory lock per limit
-- concerned, always in (scope, name) order so claimers cannot deadlock, and counts the
-- in-flight jobs again under those locks: a concurrent claimer of the same limit waits
-- until this transaction commits, then sees its claims. Candidates beyond the room left
-- stay pending. Only claims of limited jobs are serialised, and only per limit.
--
-- p_start (new in version 2, default false): claim straight into 'running', with
-- started_at set, for a caller that hands the jobs to running handlers in the same
-- transaction (the worker does): one update per job instead of a claim and a start.
--
-- Settings: see version 1 for why plan_cache_mode and enable_sort are pinned.
--
-- A new argument is a new signature: version 1 is dropped, not replaced.
DROP FUNCTION claim_job_batch(text, text[], integer, text[]);

CREATE FUNCTION claim_job_batch(
    p_worker_id text,
    p_job_types text[],
    p_batch_size integer DEFAULT 10,
    p_queues text[] DEFAULT NULL,
    p_start boolean DEFAULT false
) RETURNS SETOF pgqueue_jobs
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan
SET enable_sort = off
AS $$
DECLARE
    v_paused text[];
    v_full_queues text[];
    v_full_types text[];
    v_candidates uuid[];
    v_keep uuid[];
    v_passed_over uuid[];
    v_limited boolean;
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
                       AND CASE l.scope WHEN 'queue' THEN j.queue ELSE j.job_type END = l.name);
        END IF;

        SELECT array_agg(due.id) INTO v_candidates
          FROM (
            SELECT id
              FROM pgqueue_jobs
             WHERE status = 'pending'
               AND run_at <= now()
               AND (p_queues IS NULL OR queue = ANY (p_queues))
               AND (p_job_types IS NULL OR job_type = ANY (p_job_types))
               AND (v_paused IS NULL OR queue <> ALL (v_paused))
               AND (v_full_queues IS NULL OR queue <> ALL (v_full_queues))
               AND (v_full_types IS NULL OR job_type <> ALL (v_full_types))
               AND (v_passed_over IS NULL OR id <> ALL (v_passed_over))
             ORDER BY priority DESC, created_at ASC
             LIMIT v_wanted
             FOR UPDATE SKIP LOCKED
          ) AS due;
        EXIT WHEN v_candidates IS NULL;

        v_keep := v_candidates;
        IF v_limited THEN
            FOR v_limit IN
                SELECT DISTINCT l.scope, l.name
                  FROM pgqueue_limits AS l
                  JOIN pgqueue_jobs AS j
                    ON j.id = ANY (v_candidates)
                   AND CASE l.scope WHEN 'queue' THEN j.queue ELSE j.job_type END = l.name
                 ORDER BY l.scope, l.name
            LOOP
                PERFORM pg_advisory_xact_lock(
                    hashtextextended('pgqueue_limit:' || v_limit.scope || ':' || v_limit.name, 0));
            END LOOP;

            -- Under the locks: keep candidates, in claim order within each limit, while
            -- the limit has room. Ranking per queue and per job type separately can leave
            -- a little room unused in this pass; it never lets a limit be exceeded.
            SELECT array_agg(ranked.id) INTO v_keep
              FROM (
                SELECT c.id, c.queue, c.job_type,
                       row_number() OVER (PARTITION BY c.queue
                                          ORDER BY c.priority DESC, c.created_at) AS queue_rank,
                       row_number() OVER (PARTITION BY c.job_type
                                          ORDER BY c.priority DESC, c.created_at) AS type_rank
                  FROM pgqueue_jobs AS c
                 WHERE c.id = ANY (v_candidates)
              ) AS ranked
              LEFT JOIN pgqueue_limits AS ql ON ql.scope = 'queue' AND ql.name = ranked.queue
              LEFT JOIN pgqueue_limits AS tl
                     ON tl.scope = 'job_type' AND tl.name = ranked.job_type
             WHERE (ql.name IS NULL OR ranked.queue_rank <= ql.max_running - (
                        SELECT count(*) FROM pgqueue_jobs AS j
                         WHERE j.status IN ('claimed', 'running') AND j.queue = ranked.queue))
               AND (tl.name IS NULL OR ranked.type_rank <= tl.max_running - (
                        SELECT count(*) FROM pgqueue_jobs AS j
                         WHERE j.status IN ('claimed', 'running')
                           AND j.job_type = ranked.job_type));
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

        v_wanted := v_wanted - COALESCE(cardinality(v_keep), 0);
        EXIT WHEN v_wanted <= 0
               OR COALESCE(cardinality(v_keep), 0) = cardinality(v_candidates);
        v_passed_over := COALESCE(v_passed_over, '{}')
            || ARRAY(SELECT unnest(v_candidates) EXCEPT SELECT unnest(COALESCE(v_keep, '{}')));
    END LOOP;
END;
$$;
