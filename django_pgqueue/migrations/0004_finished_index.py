from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    # The jobs table is live: build the index without locking out writers.
    atomic = False

    dependencies = [
        ("django_pgqueue", "0003_job_events"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status__in", ["completed", "failed", "cancelled"])),
                fields=["completed_at"],
                name="idx_jobs_finished",
            ),
        ),
    ]
