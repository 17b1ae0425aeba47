from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    # The jobs table is live: build the index without locking out writers.
    atomic = False

    dependencies = [
        ("django_pgqueue", "0009_job_snoozes"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("unique_key__isnull", False)),
                fields=["unique_key", "created_at"],
                name="idx_jobs_unique_recent",
            ),
        ),
    ]
