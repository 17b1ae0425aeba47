from django.db import migrations

from django_pgqueue.sqlfiles import read_sql

RESTORE_FOREIGN_KEY = (
    "DROP TRIGGER pgqueue_jobs_delete_steps ON pgqueue_jobs; "
    "DROP FUNCTION pgqueue_delete_job_steps(); "
    "DELETE FROM pgqueue_job_steps AS steps WHERE NOT EXISTS "
    "(SELECT FROM pgqueue_jobs AS jobs WHERE jobs.id = steps.job_id); "
    "ALTER TABLE pgqueue_job_steps ADD CONSTRAINT pgqueue_job_steps_job_fk "
    "FOREIGN KEY (job_id) REFERENCES pgqueue_jobs (id) ON DELETE CASCADE;"
)


class Migration(migrations.Migration):
    # A checkpoint's write no longer checks (and locks) its job through a foreign key:
    # deleting jobs deletes their checkpoints by a statement trigger
    # (steps_cascade_v1.sql).

    dependencies = [
        ("django_pgqueue", "0037_failed_index_by_error_class"),
    ]

    operations = [
        migrations.RunSQL(sql=read_sql("steps_cascade_v1.sql"), reverse_sql=RESTORE_FOREIGN_KEY),
    ]
