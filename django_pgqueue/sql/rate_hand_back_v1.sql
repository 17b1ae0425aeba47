-- pgqueue_rate_hand_back, version 1: a worker gives back rate-limited jobs it claimed
-- and never started, and with them the room they held in their limits' windows.
--
-- A claim that prefetches a rate-limited job (claim_job_batch's p_start_within) counts
-- it in each of its limits' windows at the moment it must start by: the row of
-- pgqueue_rate_starts at the job's started_at. A worker that cannot start it by then
-- hands it back unstarted, and its count is taken back here: a job that never started
-- holds no room, so no window can go over its limit for it, and the limit's next job
-- need not wait a whole period for room a job never used. The marks of full windows
-- still ahead for these limits are cleared too (their windows have room now; a mark
-- only saves a claim work, and the claim counts each window again under its lock).
--
-- Call it in the transaction that sets the jobs pending again, before that statement:
-- only jobs still claimed or running by p_worker_id count (one recovered and claimed by
-- another worker in between holds that worker's room). Rows are locked in one order,
-- so two workers handing back jobs of the same limits never wait on each other in a
-- circle; claims insert their own rows and never wait for these. Returns how many
-- reservations were taken back.
CREATE FUNCTION pgqueue_rate_hand_back(p_job_ids uuid[], p_worker_id text)
RETURNS integer
LANGUAGE sql AS $$
    WITH back AS (
        SELECT r.scope,
               CASE r.scope WHEN 'key' THEN j.job_type || E'\n' || j.concurrency_key
                            ELSE r.name END AS name,
               j.started_at,
               count(*)::integer AS jobs
          FROM pgqueue_jobs AS j
          JOIN pgqueue_rate_limits AS r
            ON CASE r.scope WHEN 'queue' THEN j.queue ELSE j.job_type END = r.name
           AND (r.scope <> 'key' OR j.concurrency_key IS NOT NULL)
         WHERE j.id = ANY (p_job_ids)
           AND j.worker_id = p_worker_id
           AND j.status IN ('claimed', 'running')
           AND j.started_at IS NOT NULL
         GROUP BY 1, 2, 3
    ),
    locked AS (
        SELECT s.scope, s.name, s.started_at, COALESCE(b.jobs, 0) AS jobs
          FROM pgqueue_rate_starts AS s
          LEFT JOIN back AS b
            ON b.scope = s.scope AND b.name = s.name AND b.started_at = s.started_at
         WHERE (s.scope, s.name) IN (SELECT scope, name FROM back)
           AND (b.jobs IS NOT NULL OR s.full_until > now())
         ORDER BY s.scope, s.name, s.started_at
           FOR UPDATE OF s
    ),
    taken_back AS (
        UPDATE pgqueue_rate_starts AS s
           SET jobs = greatest(s.jobs - locked.jobs, 0),
               full_until = NULL
          FROM locked
         WHERE s.scope = locked.scope AND s.name = locked.name
           AND s.started_at = locked.started_at
        RETURNING locked.jobs
    )
    SELECT COALESCE(sum(jobs), 0)::integer FROM taken_back
$$;
