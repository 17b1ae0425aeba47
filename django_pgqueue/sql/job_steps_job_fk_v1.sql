-- The foreign key of pgqueue_job_steps to its job, with ON DELETE CASCADE, as for
-- pgqueue_job_events (job_events_job_fk_v1.sql): deleting jobs outside the ORM (pruning
-- in SQL, psql) deletes their checkpoints.
ALTER TABLE pgqueue_job_steps
    ADD CONSTRAINT pgqueue_job_steps_job_fk
    FOREIGN KEY (job_id) REFERENCES pgqueue_jobs (id) ON DELETE CASCADE;
