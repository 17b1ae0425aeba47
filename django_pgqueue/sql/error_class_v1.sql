-- A job's error class, kept in pgqueue_jobs.error_class: the exception class its
-- last_error begins with ('ValueError: ...' is ValueError, 'payments.CardDeclined: ...'
-- is payments.CardDeclined), else '' (a lost worker's error, a workflow's 'Not run: ...').
--
-- The admin's errors page groups failed jobs by job type and error class, and the
-- changelist filters on it: stored in a column of idx_jobs_failed, both read the index,
-- not every failed row's last_error.
--
-- pgqueue_error_class() is the one definition of the rule: the trigger below applies it
-- whenever an UPDATE changes last_error (every path that records an error: a worker's
-- finish, recovery, a workflow's cascade, a retry that clears it), and the migration
-- that added the column applied it to the rows already there. The package never inserts
-- a job with an error, so there is no INSERT trigger: one would make PostgreSQL insert
-- enqueue_many()'s COPY row by row.
CREATE FUNCTION pgqueue_error_class(error text) RETURNS varchar
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT left(coalesce(substring(error, '^([A-Za-z_][A-Za-z0-9_.]*):'), ''), 200)
$$;

CREATE FUNCTION pgqueue_note_error_class() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    NEW.error_class := pgqueue_error_class(NEW.last_error);
    RETURN NEW;
END
$$;

-- The WHEN clause is checked in C for every updated row; only a changed error runs the
-- function. A finish without an error (most of them) pays nothing else.
CREATE TRIGGER pgqueue_jobs_error_class
    BEFORE UPDATE OF last_error ON pgqueue_jobs
    FOR EACH ROW
    WHEN (NEW.last_error IS DISTINCT FROM OLD.last_error)
    EXECUTE FUNCTION pgqueue_note_error_class();
