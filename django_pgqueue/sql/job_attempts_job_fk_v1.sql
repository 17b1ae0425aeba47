-- The foreign key of pgqueue_job_attempts to its job, with ON DELETE CASCADE, as for
-- pgqueue_job_events (job_events_job_fk_v1.sql): deleting jobs outside the ORM (pruning
-- in SQL, psql) deletes their attempts.
ALTER TABLE pgqueue_job_attempts
    ADD CONSTRAINT pgqueue_job_attempts_job_fk
    FOREIGN KEY (job_id) REFERENCES pgqueue_jobs (id) ON DELETE CASCADE;
