import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models

from django_pgqueue.sqlfiles import read_sql


class Migration(migrations.Migration):
    # The attempts that did not complete their jobs (JobAttempt), written with their
    # outcome by the worker's FINISH statement and by recovery (recover_stale_jobs,
    # version 2, the same signature); and the attempt of each progress event. A new,
    # empty table, and a nullable column added without a rewrite.

    dependencies = [
        ("django_pgqueue", "0025_job_trace_context"),
    ]

    operations = [
        migrations.AddField(
            model_name="jobevent",
            name="attempt",
            field=models.IntegerField(blank=True, null=True),
        ),
        migrations.CreateModel(
            name="JobAttempt",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("attempt", models.IntegerField()),
                ("worker_id", models.CharField(max_length=255)),
                ("started_at", models.DateTimeField(blank=True, null=True)),
                (
                    "ended_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                (
                    "outcome",
                    models.CharField(
                        choices=[
                            ("retried", "Failed, retried"),
                            ("failed", "Failed"),
                            ("cancelled", "Cancelled"),
                            ("snoozed", "Snoozed"),
                            ("lost", "Lost with its worker"),
                        ],
                        max_length=20,
                    ),
                ),
                ("error", models.TextField(blank=True, db_default="")),
                ("traceback", models.TextField(blank=True, db_default="")),
                (
                    "job",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="attempt_history",
                        to="django_pgqueue.job",
                    ),
                ),
            ],
            options={
                "verbose_name": "job attempt",
                "verbose_name_plural": "job attempts",
                "db_table": "pgqueue_job_attempts",
                "ordering": ("id",),
                "indexes": [models.Index(fields=["job", "id"], name="idx_job_attempts_job")],
            },
        ),
        migrations.RunSQL(
            sql=read_sql("job_attempts_job_fk_v1.sql"),
            reverse_sql=(
                "ALTER TABLE pgqueue_job_attempts DROP CONSTRAINT pgqueue_job_attempts_job_fk;"
            ),
        ),
        migrations.RunSQL(
            sql=read_sql("recover_stale_jobs_v2.sql"),
            reverse_sql=read_sql("recover_stale_jobs_v1.sql").replace(
                "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1
            ),
        ),
    ]
