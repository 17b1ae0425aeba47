from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models

from django_pgqueue.sqlfiles import read_sql

CLAIM_FIELDS = ["-priority", "run_at", "created_at"]

DROP_KEY_LIMITS = """
DROP FUNCTION pgqueue_release_held_jobs();
DROP FUNCTION pgqueue_release_held_keys(text[], text[]);
"""

SCOPES = ["queue", "job_type", "key"]


class Migration(migrations.Migration):
    # The jobs table is live: the new columns need no rewrite (a constant default), the
    # index builds let writers and claimers go on, and the claim's body is swapped in one
    # statement. Order: the new claimable index exists before the claim that walks it;
    # the old one goes after.
    atomic = False

    dependencies = [
        ("django_pgqueue", "0011_limit_overrides"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="concurrency_key",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="held",
            field=models.BooleanField(db_default=False),
        ),
        migrations.AlterField(
            model_name="concurrencylimit",
            name="scope",
            field=models.CharField(
                choices=[
                    ("queue", "Queue"),
                    ("job_type", "Job type"),
                    ("key", "Each key of a job type"),
                ],
                max_length=16,
            ),
        ),
        migrations.RemoveConstraint(
            model_name="concurrencylimit", name="pgqueue_limits_scope_valid"
        ),
        migrations.AddConstraint(
            model_name="concurrencylimit",
            constraint=models.CheckConstraint(
                condition=models.Q(("scope__in", SCOPES)), name="pgqueue_limits_scope_valid"
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("held", False), ("status", "pending")),
                fields=[*CLAIM_FIELDS, "queue", "job_type"],
                name="idx_jobs_claimable_v4",
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("concurrency_key__isnull", False), ("status", "pending")),
                fields=["job_type", "concurrency_key", "held", *CLAIM_FIELDS],
                name="idx_jobs_keyed",
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(
                    ("concurrency_key__isnull", False), ("status__in", ["claimed", "running"])
                ),
                fields=["job_type", "concurrency_key"],
                name="idx_jobs_keyed_in_flight",
            ),
        ),
        migrations.RunSQL(sql=read_sql("key_limits_v1.sql"), reverse_sql=DROP_KEY_LIMITS),
        migrations.RunSQL(
            sql=read_sql("claim_job_batch_v4.sql"),
            reverse_sql=read_sql("claim_job_batch_v3.sql"),
        ),
        RemoveIndexConcurrently(model_name="job", name="idx_jobs_claimable"),
        migrations.RenameIndex(
            model_name="job", new_name="idx_jobs_claimable", old_name="idx_jobs_claimable_v4"
        ),
    ]
