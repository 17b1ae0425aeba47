from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models

from django_pgqueue.sqlfiles import read_sql

PENDING = models.Q(("status", "pending"))


class Migration(migrations.Migration):
    # The jobs table is live: both index builds let writers and claimers go on, and the
    # function's body is swapped in one statement (CREATE OR REPLACE). Order: the new
    # index exists before the claim that walks it, the old one goes after.
    atomic = False

    dependencies = [
        ("django_pgqueue", "0007_jobs_autovacuum"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=PENDING,
                fields=["-priority", "run_at", "created_at", "queue", "job_type"],
                name="idx_jobs_claimable_v3",
            ),
        ),
        migrations.RunSQL(
            sql=read_sql("claim_job_batch_v3.sql"),
            # Version 2's file drops version 1 first, so version 1 is put back for it.
            # One script, split into statements as the forward SQL is.
            reverse_sql="\n".join(
                [
                    "DROP FUNCTION claim_job_batch(text, text[], integer, text[], boolean);",
                    read_sql("claim_job_batch_v1.sql"),
                    read_sql("claim_job_batch_v2.sql"),
                ]
            ),
        ),
        RemoveIndexConcurrently(model_name="job", name="idx_jobs_claimable"),
        migrations.RenameIndex(
            model_name="job", new_name="idx_jobs_claimable", old_name="idx_jobs_claimable_v3"
        ),
    ]
