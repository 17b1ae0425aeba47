from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

FINISHED = models.Q(("status__in", ["completed", "failed", "cancelled"]))


class Migration(migrations.Migration):
    # The admin's filters on a queue or a job type that few jobs have read these (with
    # the active states' own indexes) instead of the table. The jobs table is live:
    # built without locking out writers.
    atomic = False

    dependencies = [
        ("django_pgqueue", "0043_jobs_storage"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=FINISHED, fields=["queue"], name="idx_jobs_finished_queue"
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=FINISHED, fields=["job_type"], name="idx_jobs_finished_job_type"
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status", "waiting")),
                fields=["queue", "job_type"],
                name="idx_jobs_waiting",
            ),
        ),
    ]
