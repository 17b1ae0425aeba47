from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    # The errors page groups failed jobs by job type and error class from the index
    # alone. The jobs table is live: rebuilt without locking out writers.
    atomic = False

    dependencies = [
        ("django_pgqueue", "0036_error_class"),
    ]

    operations = [
        RemoveIndexConcurrently(model_name="job", name="idx_jobs_failed"),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status", "failed")),
                fields=["job_type", "error_class", "completed_at"],
                include=("queue",),
                name="idx_jobs_failed",
            ),
        ),
    ]
