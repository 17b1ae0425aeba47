from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    # The admin's errors page reads failed jobs by job type. The jobs table is live:
    # build the index without locking out writers.
    atomic = False

    dependencies = [
        ("django_pgqueue", "0026_job_attempts"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status", "failed")),
                fields=["job_type", "completed_at"],
                name="idx_jobs_failed",
            ),
        ),
    ]
