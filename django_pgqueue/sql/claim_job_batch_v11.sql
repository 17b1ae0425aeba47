-- claim_job_batch, version 11: as version 10 (the same signature), with the claim of a
-- worker that filters nothing (no queue, job type or skipped job type given, no queue
-- paused, no limit) planned once per session instead of at every call.
--
-- That claim is the one statement of most claims: a pickup's, a drain's. Planned for
-- its arguments at each call (plan_cache_mode = force_custom_plan, which the filtered
-- walks need: version 1), its planning took a third of its time on a worker woken from
-- idle (1.5 ms a claim against 1.1 ms with a cached plan, bench/pickup.py). Without
-- filters the arguments change nothing a plan could use, so it now runs on its cached
-- generic plan (force_generic_plan, set for the statement alone: the function's own
-- SET clause restores the setting when it returns). It is the filtered claim's
-- statement: in the generic plan the filters' NULL tests pass at once.
--
-- A generic plan cannot know how many rows the walk returns: the claimed rows are
-- found by their ctids as an array (ctid = ANY, a TID scan whatever the estimate)
-- rather than by a join the planner might turn into a scan of the table.
--
-- Everything else is version 10's: see claim_job_batch_v10.sql and the versions before.
--
-- Migration 0045 adds SET enable_seqscan = off to this function: a plan cached while the
-- table was empty read the whole table at every claim (see the migration).
CREATE OR REPLACE FUNCTION claim_job_batch(
    p_worker_id text,
    p_job_types text[],
    p_batch_size integer DEFAULT 10,
    p_queues text[] DEFAULT NULL,
    p_start boolean DEFAULT false,
    p_free_slots integer DEFAULT NULL,
    p_start_within double precision DEFAULT NULL,
    p_skip_job_types text[] DEFAULT NULL
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
    v_rated boolean;
    v_rated_keys boolean;
    v_kept_rated boolean;
    v_excess uuid[];
    v_claimed_rated boolean := false;
    -- Prefetching rate-limited jobs lifts the free slots' cap on a batch (v_slots) and
    -- counts those jobs p_start_within later (v_counted_at).
    v_prefetch boolean := COALESCE(p_start_within IS NOT NULL AND p_batch_size > p_free_slots,
                                   false);
    v_slots integer := CASE WHEN v_prefetch THEN p_batch_size
                            ELSE COALESCE(p_free_slots, p_batch_size) END;
    v_counted_at timestamptz;
    v_clock timestamptz;
    v_keep_rated uuid[];
    v_wanted integer := p_batch_size;
    v_now timestamptz;
    v_lock_names text[];
    v_lock_name text;
    -- Whether the batch may take a job lost with its worker: the worker holds none
    -- (NULL: not asked yet, only once the walk finds such a job).
    v_lost_room boolean;
    v_lost uuid[];
    v_lost_pick uuid;
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
    IF p_free_slots < 0 THEN
        RAISE EXCEPTION 'claim_job_batch: p_free_slots must be NULL or at least 0, got %',
            p_free_slots
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_start_within <= 0 OR p_start_within > 60 OR p_start_within = 'NaN' THEN
        RAISE EXCEPTION 'claim_job_batch: p_start_within must be NULL or more than 0 and '
                        'at most 60 seconds, got %', p_start_within
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- One statement for what every claim reads first: each costs a round into the
    -- executor, and a claim without limits is little more than these and its walk.
    SELECT (SELECT array_agg(name) FROM pgqueue_queues WHERE paused_at IS NOT NULL),
           EXISTS (SELECT 1 FROM pgqueue_limits),
           EXISTS (SELECT 1 FROM pgqueue_limits WHERE scope = 'key'),
           EXISTS (SELECT 1 FROM pgqueue_rate_limits)
      INTO v_paused, v_limited, v_keyed, v_rated;
    IF v_rated THEN
        v_rated_keys := EXISTS (SELECT 1 FROM pgqueue_rate_limits WHERE scope = 'key');
    END IF;

    -- No limit of any kind: one statement walks and claims, the rows it locked updated
    -- by their ctid (no array of candidates, no second look-up of each row by id). Of
    -- the jobs lost with their worker, one, if the worker holds none: both subqueries
    -- run only once the walk found such a job. A claim that filters nothing runs on
    -- the statement's cached generic plan (its filters' NULL tests are then checks
    -- that pass at once); a filtered one is planned for its arguments.
    IF NOT v_limited AND NOT v_rated THEN
        IF p_queues IS NULL AND p_job_types IS NULL AND p_skip_job_types IS NULL
           AND v_paused IS NULL THEN
            PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
        END IF;
        RETURN QUERY
        WITH due AS (
            SELECT ctid, lost_with_worker AS lost
              FROM pgqueue_jobs
             WHERE status = 'pending'
               AND NOT held
               AND run_at <= now()
               AND (p_queues IS NULL OR queue = ANY (p_queues))
               AND (p_job_types IS NULL OR job_type = ANY (p_job_types))
               AND (p_skip_job_types IS NULL OR job_type <> ALL (p_skip_job_types))
               AND (v_paused IS NULL OR queue <> ALL (v_paused))
             ORDER BY priority DESC, run_at, created_at
             LIMIT p_batch_size
             FOR UPDATE SKIP LOCKED
        )
        UPDATE pgqueue_jobs AS jobs
           SET status = CASE WHEN p_start THEN 'running' ELSE 'claimed' END,
               worker_id = p_worker_id,
               claimed_at = now(),
               started_at = CASE WHEN p_start THEN now() ELSE jobs.started_at END,
               heartbeat_at = now(),
               attempts = jobs.attempts + 1,
               worker_ids = jobs.worker_ids || to_jsonb(p_worker_id)
         WHERE jobs.ctid = ANY (ARRAY(
                SELECT due.ctid FROM due
                 WHERE NOT due.lost
                    OR due.ctid = (SELECT first.ctid FROM due AS first WHERE first.lost LIMIT 1)
                       AND NOT pgqueue_holds_lost_job(p_worker_id)))
        RETURNING jobs.*;
        RETURN;
    END IF;
    -- A key is named job_type, newline, concurrency_key: job types have no newline.

    -- Without limits, one walk claims the batch. With limits, at most three: a walk
    -- whose limited candidates did not all fit is followed by another (now skipping the
    -- limits that filled up) to fill the batch.
    FOR pass IN 1..3 LOOP
        IF v_rated AND pass > 1 THEN
            PERFORM set_config('plan_cache_mode', 'force_custom_plan', true);
        END IF;
        v_full_queues := NULL;
        v_full_types := NULL;
        v_full_keys := NULL;
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
        IF v_rated THEN
            -- The clock once, not per row: clock_timestamp() is volatile, and a row
            -- condition on it cannot bound an index scan of the log.
            v_clock := clock_timestamp();
            -- Rate limits without room now, or every one when no slot is free (a per-key
            -- rate then leaves out its whole job type).
            SELECT v_full_queues || array_agg(r.name) FILTER (WHERE r.scope = 'queue'),
                   v_full_types || array_agg(r.name) FILTER (WHERE r.scope <> 'queue')
              INTO v_full_queues, v_full_types
              FROM pgqueue_rate_limits AS r
             WHERE v_slots <= 0
                OR r.scope <> 'key' AND r.max_jobs <= (
                    SELECT w.jobs
                      FROM pgqueue_rate_window(r.scope, r.name, r.max_jobs, r.period_seconds,
                                               v_clock) AS w);
            IF v_rated_keys AND v_slots > 0 THEN
                -- Keys at their rate: those a claim filled, until their window has room
                -- (full_until, idx_rate_starts_marks), of per-key rates that still exist.
                -- A key marked twice is named twice: the walk's test does not mind.
                SELECT v_full_keys || array_agg(s.name) INTO v_full_keys
                  FROM pgqueue_rate_starts AS s
                  JOIN pgqueue_rate_limits AS r
                    ON r.scope = 'key' AND r.name = pgqueue_rate_limit_name(s.scope, s.name)
                 WHERE s.full_until > v_clock AND s.scope = 'key';
            END IF;
        END IF;

        SELECT array_agg(due.id) FILTER (WHERE NOT due.lost),
               array_agg(due.id) FILTER (WHERE due.lost)
          INTO v_candidates, v_lost
          FROM (
            SELECT id, lost_with_worker AS lost
              FROM pgqueue_jobs
             WHERE status = 'pending'
               AND NOT held
               AND run_at <= now()
               AND (p_queues IS NULL OR queue = ANY (p_queues))
               AND (p_job_types IS NULL OR job_type = ANY (p_job_types))
               AND (p_skip_job_types IS NULL OR job_type <> ALL (p_skip_job_types))
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
        IF v_lost IS NOT NULL THEN
            -- One job lost with its worker, if the worker holds none; the walk's others
            -- are passed over from now on.
            IF v_lost_room IS NULL THEN
                v_lost_room := NOT pgqueue_holds_lost_job(p_worker_id);
            END IF;
            IF v_lost_room THEN
                v_lost_pick := v_lost[1];
                v_candidates := COALESCE(v_candidates, '{}') || v_lost_pick;
                v_lost := v_lost[2:];
            END IF;
            v_passed_over := COALESCE(v_passed_over, '{}') || v_lost;
            CONTINUE WHEN COALESCE(cardinality(v_candidates), 0) = 0;
        END IF;
        EXIT WHEN v_candidates IS NULL;

        IF v_rated THEN
            -- What follows reads and writes the candidates (a hundred ids at most):
            -- cached generic plans serve as well as custom ones, without planning each
            -- statement on each call, a third of a claim's cost under many per-key
            -- rates. The walk and the reads before it are planned for their arguments
            -- (back to custom plans at the start of each pass). SET LOCAL: the
            -- function's own SET clause restores the setting when it returns.
            PERFORM set_config('plan_cache_mode', 'auto', true);

            -- A batch with rate-limited jobs is no larger than the free slots (v_slots:
            -- the batch size when prefetching): the rate-limited candidates beyond
            -- them, in claim order, are left for a later claim before any lock is
            -- taken, or every key of a backlog under per-key rates would be locked and
            -- ranked to claim a few jobs.
            SELECT array_agg(rated.id) INTO v_excess
              FROM (
                SELECT j.id,
                       row_number() OVER (ORDER BY j.priority DESC, j.run_at, j.created_at) AS n
                  FROM pgqueue_jobs AS j
                 WHERE j.id = ANY (v_candidates)
                   AND EXISTS (
                        SELECT 1 FROM pgqueue_rate_limits_of(j.queue, j.job_type,
                                                             j.concurrency_key))
              ) AS rated
             WHERE rated.n > greatest(v_slots, 0);
            IF v_excess IS NOT NULL THEN
                v_passed_over := COALESCE(v_passed_over, '{}') || v_excess;
                v_candidates := ARRAY(SELECT unnest(v_candidates) EXCEPT SELECT unnest(v_excess));
                CONTINUE WHEN cardinality(v_candidates) = 0;
            END IF;
        END IF;

        v_keep := v_candidates;
        v_kept_rated := false;
        IF v_limited OR v_rated THEN
            -- Every limit the candidates touch, in one order: concurrency limits
            -- ('pgqueue_limit:...'), then rate limits ('pgqueue_rate:...').
            SELECT array_agg(lock_name ORDER BY lock_name) INTO v_lock_names
              FROM (
                SELECT 'pgqueue_limit:' || l.scope || ':'
                       || CASE l.scope WHEN 'key' THEN j.job_type || E'\n' || j.concurrency_key
                                       ELSE l.name END AS lock_name
                  FROM pgqueue_limits AS l
                  JOIN pgqueue_jobs AS j
                    ON j.id = ANY (v_candidates)
                   AND CASE l.scope WHEN 'queue' THEN j.queue ELSE j.job_type END = l.name
                 WHERE l.scope <> 'key' OR j.concurrency_key IS NOT NULL
                UNION
                SELECT 'pgqueue_rate:' || r.scope || ':' || r.window_name
                  FROM pgqueue_jobs AS j
                 CROSS JOIN LATERAL pgqueue_rate_limits_of(j.queue, j.job_type,
                                                           j.concurrency_key) AS r
                 WHERE j.id = ANY (v_candidates)
              ) AS locks;
            IF pass = 1 THEN
                -- One statement for all of them, in the array's order (a hundred keys
                -- took a hundred statements).
                PERFORM pg_advisory_xact_lock(hashtextextended(lock_name, 0))
                   FROM unnest(v_lock_names) WITH ORDINALITY AS locks (lock_name, n)
                  ORDER BY n;
            ELSE
                FOREACH v_lock_name IN ARRAY COALESCE(v_lock_names, '{}') LOOP
                    IF NOT pg_try_advisory_xact_lock(hashtextextended(v_lock_name, 0)) THEN
                        v_candidates := NULL;  -- another claimer has it: the batch ends here
                        EXIT;
                    END IF;
                END LOOP;
            END IF;
            EXIT WHEN v_candidates IS NULL;
            v_now := CASE WHEN v_rated THEN clock_timestamp() ELSE now() END;
            v_counted_at := CASE WHEN v_prefetch
                                 THEN v_now + p_start_within * interval '1 second'
                                 ELSE v_now END;

            -- Under the locks: keep candidates, in claim order within each limit, while
            -- the limit has room. Ranking per queue, job type and key separately can leave
            -- a little room unused in this pass; it never lets a limit be exceeded.
            SELECT array_agg(kept.id ORDER BY kept.priority DESC, kept.run_at, kept.created_at),
                   COALESCE(bool_or(kept.rated), false),
                   array_agg(kept.id) FILTER (WHERE kept.rated)
              INTO v_keep, v_kept_rated, v_keep_rated
              FROM (
                SELECT ranked.id, ranked.priority, ranked.run_at, ranked.created_at,
                       qr.name IS NOT NULL OR tr.name IS NOT NULL OR kr.name IS NOT NULL
                           AS rated
                  FROM (
                    SELECT c.id, c.queue, c.job_type, c.priority, c.run_at, c.created_at,
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
                  LEFT JOIN pgqueue_rate_limits AS qr
                         ON qr.scope = 'queue' AND qr.name = ranked.queue
                  LEFT JOIN pgqueue_rate_limits AS tr
                         ON tr.scope = 'job_type' AND tr.name = ranked.job_type
                  LEFT JOIN pgqueue_rate_limits AS kr
                         ON kr.scope = 'key' AND kr.name = ranked.job_type
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
                               AND j.concurrency_key = ranked.concurrency_key))
                   AND (qr.name IS NULL OR ranked.queue_rank <= qr.max_jobs - (
                            SELECT w.jobs
                              FROM pgqueue_rate_window(qr.scope, qr.name, qr.max_jobs,
                                                       qr.period_seconds, v_now) AS w))
                   AND (tr.name IS NULL OR ranked.type_rank <= tr.max_jobs - (
                            SELECT w.jobs
                              FROM pgqueue_rate_window(tr.scope, tr.name, tr.max_jobs,
                                                       tr.period_seconds, v_now) AS w))
                   AND (kr.name IS NULL OR ranked.key_rank <= kr.max_jobs - (
                            -- kr.scope, not 'key': the planner cannot then pick the
                            -- partial index of every key's recent starts (and read them
                            -- all for each key) over the primary key.
                            SELECT w.jobs
                              FROM pgqueue_rate_window(
                                       kr.scope,
                                       ranked.job_type || E'\n' || ranked.concurrency_key,
                                       kr.max_jobs, kr.period_seconds, v_now) AS w))
              ) AS kept;

            -- A batch with rate-limited jobs fits the free slots: keep its first jobs.
            IF (v_kept_rated OR v_claimed_rated) AND cardinality(v_keep) > v_slots THEN
                v_keep := v_keep[1:greatest(v_slots, 0)];
                v_kept_rated := EXISTS (
                    SELECT 1 FROM pgqueue_jobs AS j
                     CROSS JOIN LATERAL pgqueue_rate_limits_of(j.queue, j.job_type,
                                                               j.concurrency_key) AS r
                     WHERE j.id = ANY (v_keep));
            END IF;
        ELSE
            v_now := now();
            v_keep_rated := NULL;
        END IF;

        RETURN QUERY
        UPDATE pgqueue_jobs AS jobs
           SET status = CASE WHEN p_start THEN 'running' ELSE 'claimed' END,
               worker_id = p_worker_id,
               claimed_at = v_now,
               started_at = CASE WHEN NOT p_start THEN jobs.started_at
                                 WHEN jobs.id = ANY (v_keep_rated) THEN v_counted_at
                                 ELSE v_now END,
               heartbeat_at = v_now,
               attempts = jobs.attempts + 1,
               worker_ids = jobs.worker_ids || to_jsonb(p_worker_id)
         WHERE jobs.id = ANY (COALESCE(v_keep, '{}'))
        RETURNING jobs.*;

        -- The claims of each rate limit, counted in its window from now on; a claim
        -- that fills a window marks its row with when the window's oldest start leaves
        -- it (full_until): no claim can find room before then. (w reads the window
        -- through the primary key: see the ranking's kr.)
        IF v_kept_rated THEN
            INSERT INTO pgqueue_rate_starts AS s (scope, name, started_at, jobs, full_until)
            SELECT claimed.scope, claimed.name, v_counted_at, claimed.jobs,
                   CASE WHEN w.jobs + claimed.jobs >= claimed.max_jobs
                        THEN least(w.oldest, v_counted_at)
                             + claimed.period_seconds * interval '1 second' END
              FROM (
                SELECT r.scope, r.window_name AS name, count(*) AS jobs, r.max_jobs,
                       r.period_seconds
                  FROM pgqueue_jobs AS j
                 CROSS JOIN LATERAL pgqueue_rate_limits_of(j.queue, j.job_type,
                                                           j.concurrency_key) AS r
                 WHERE j.id = ANY (v_keep)
                 GROUP BY 1, 2, r.max_jobs, r.period_seconds
              ) AS claimed
              CROSS JOIN LATERAL pgqueue_rate_window(claimed.scope, claimed.name,
                                                     claimed.max_jobs,
                                                     claimed.period_seconds, v_now) AS w
            ON CONFLICT (scope, name, started_at) DO UPDATE
               SET jobs = s.jobs + EXCLUDED.jobs,
                   full_until = COALESCE(EXCLUDED.full_until, s.full_until);
            v_claimed_rated := true;
        END IF;

        -- The claimed jobs of keys leave room for their keys' held jobs (key_limits_v2.sql),
        -- under per-key concurrency limits or per-key rates.
        IF (v_keyed OR COALESCE(v_rated_keys, false)) AND v_keep IS NOT NULL THEN
            PERFORM pgqueue_release_held_keys(array_agg(claimed.job_type),
                                              array_agg(claimed.concurrency_key))
               FROM pgqueue_jobs AS claimed
              WHERE claimed.id = ANY (v_keep) AND claimed.concurrency_key IS NOT NULL
             HAVING count(*) > 0;
        END IF;

        IF v_lost_pick = ANY (v_keep) THEN
            v_lost_room := false;  -- it took one: no other in this claim
        END IF;
        v_wanted := v_wanted - COALESCE(cardinality(v_keep), 0);
        v_slots := v_slots - COALESCE(cardinality(v_keep), 0);
        IF v_claimed_rated THEN
            v_wanted := least(v_wanted, v_slots);
        END IF;
        EXIT WHEN v_wanted <= 0
               OR COALESCE(cardinality(v_keep), 0) = cardinality(v_candidates);
        v_passed_over := COALESCE(v_passed_over, '{}')
            || ARRAY(SELECT unnest(v_candidates) EXCEPT SELECT unnest(COALESCE(v_keep, '{}')));
    END LOOP;
END;
$$;
