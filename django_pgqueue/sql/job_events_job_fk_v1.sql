-- The foreign key of pgqueue_job_events to its job, with ON DELETE CASCADE.
--
-- Django 5.2 cannot declare a database-level cascade, and without one any DELETE of
-- jobs made outside the ORM (pruning in SQL, psql) would fail on the job's events.
ALTER TABLE pgqueue_job_events
    ADD CONSTRAINT pgqueue_job_events_job_fk
    FOREIGN KEY (job_id) REFERENCES pgqueue_jobs (id) ON DELETE CASCADE;
