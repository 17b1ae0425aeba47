from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    # The overview counts failed jobs per queue: with the queue in the index, from the
    # index alone. The jobs table is live: rebuilt without locking out writers.
    atomic = False

    dependencies = [
        ("django_pgqueue", "0034_hourly_rollups"),
    ]

    operations = [
        RemoveIndexConcurrently(model_name="job", name="idx_jobs_failed"),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status", "failed")),
                fields=["job_type", "completed_at"],
                include=("queue",),
                name="idx_jobs_failed",
            ),
        ),
    ]
