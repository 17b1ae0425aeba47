-- Events, version 1: pgqueue_await_event, where a job starts or resumes waiting for an
-- event (job.wait_for_event()), and pgqueue_emit_event, which emits one (emit_event()).
--
-- The two are ordered by an advisory lock on the event's name, in the key space
-- 1885827429: an emitter takes it shared until its transaction ends, a job starting to
-- wait takes it exclusively for its own short transaction. Whichever comes second sees
-- what the first committed: a waiter sees the event and receives it at once, or an
-- emitter sees the waiter's checkpoint and wakes its job. Without the lock both could
-- miss each other (the emitter's wake-up runs before its commit), and the job would
-- sleep until its timeout. Emitters never wait on each other; a waiter holds one lock
-- and waits for nothing else while it does, so no cycle of waits can form.
--
-- The checkpoint of a wait is a row of pgqueue_job_steps of kind 'event', its result
-- NULL while it waits (the partial index pgqueue_job_steps_waiting holds only those)
-- and the payload (as JSON, 'null' for none) once received.

-- Returns the wait's checkpoint, result as text (NULL: still waiting) and wake_at (its
-- timeout); no row when the job is no longer held by this attempt (p_worker_id and
-- p_attempt, as the steps' checkpoints check). A new wait records p_wake_at and
-- p_started; one that is already recorded keeps its own.
CREATE FUNCTION pgqueue_await_event(p_job_id uuid, p_worker_id text, p_attempt integer,
                                    p_name text, p_wake_at timestamptz,
                                    p_started timestamptz)
RETURNS TABLE (result text, wake_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    v_payload jsonb;
    v_emitted boolean;
BEGIN
    -- Checked first: a job this connection cannot see (one inside a test's transaction)
    -- returns at once, without waiting for a lock that transaction may hold.
    PERFORM 1 FROM pgqueue_jobs AS j
      WHERE j.id = p_job_id AND j.status IN ('claimed', 'running')
        AND j.worker_id IS NOT DISTINCT FROM p_worker_id AND j.attempts = p_attempt;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(1885827429, hashtext(p_name));
    -- Each statement below sees what committed while this one waited for the lock.
    SELECT e.payload INTO v_payload FROM pgqueue_emitted_events AS e WHERE e.name = p_name;
    v_emitted := FOUND;
    RETURN QUERY
    INSERT INTO pgqueue_job_steps AS s
           (job_id, name, kind, attempt, result, wake_at, started_at, completed_at)
    VALUES (p_job_id, p_name, 'event', p_attempt,
            CASE WHEN v_emitted THEN COALESCE(v_payload, 'null'::jsonb) END,
            p_wake_at, p_started, now())
    ON CONFLICT (job_id, name) DO UPDATE
       SET result = COALESCE(v_payload, 'null'::jsonb), completed_at = now()
     WHERE v_emitted AND s.kind = 'event' AND s.result IS NULL
    RETURNING s.result::text, s.wake_at;
    IF NOT FOUND THEN  -- recorded before, and nothing to change
        RETURN QUERY SELECT s.result::text, s.wake_at FROM pgqueue_job_steps AS s
                      WHERE s.job_id = p_job_id AND s.name = p_name;
    END IF;
END;
$$;

-- Emits the event p_name with p_payload, in the caller's transaction: the event is
-- stored (replacing an earlier payload of the name), the payload is written into the
-- checkpoint of every wait for it (so a woken job reads it with its checkpoints, and
-- keeps the payload of the emit that woke it), and their jobs are made due, with a
-- NOTIFY on p_channel (NULL: none) for their queues. A job still running when it is
-- woken gets a run_at later than its claimed_at, which the worker's FINISH reads as
-- "woken while it ran": it suspends the job due at once. Returns how many waiting jobs
-- it woke.
CREATE FUNCTION pgqueue_emit_event(p_name text, p_payload jsonb, p_channel text)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_woken integer;
    v_notified integer;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(1885827429, hashtext(p_name));
    INSERT INTO pgqueue_emitted_events AS e (name, payload, emitted_at)
    VALUES (p_name, p_payload, now())
    ON CONFLICT (name) DO UPDATE SET payload = EXCLUDED.payload, emitted_at = now();
    WITH delivered AS (
        UPDATE pgqueue_job_steps AS s
           SET result = COALESCE(p_payload, 'null'::jsonb), completed_at = now()
          FROM pgqueue_jobs AS j
         WHERE s.kind = 'event' AND s.result IS NULL AND s.name = p_name
           AND j.id = s.job_id AND j.status IN ('pending', 'claimed', 'running')
        RETURNING s.job_id
    ), woken AS (
        UPDATE pgqueue_jobs AS j
           SET run_at = CASE WHEN j.status = 'pending' THEN now()
                             ELSE greatest(clock_timestamp(),
                                           j.claimed_at + interval '1 microsecond') END
         WHERE j.id IN (SELECT job_id FROM delivered)
           AND (j.status <> 'pending' OR j.run_at > now())
        RETURNING j.queue, j.status
    )
    SELECT count(*), count(pg_notify(p_channel, w.queue))
             FILTER (WHERE p_channel IS NOT NULL AND w.status = 'pending')
      INTO v_woken, v_notified
      FROM woken AS w;
    RETURN v_woken;
END;
$$;
