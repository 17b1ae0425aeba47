import django.db.models.deletion
import django.db.models.functions.datetime
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

from django_pgqueue.sqlfiles import read_sql


class Migration(migrations.Migration):
    # AddIndexConcurrently cannot run in a transaction: building the index must not lock
    # a live jobs table against writes.
    atomic = False

    dependencies = [
        ("django_pgqueue", "0002_sql_functions"),
    ]

    operations = [
        migrations.CreateModel(
            name="JobEvent",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "created_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                ("progress", models.SmallIntegerField()),
                ("stage", models.CharField(blank=True, max_length=200)),
                (
                    "job",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="events",
                        to="django_pgqueue.job",
                    ),
                ),
            ],
            options={
                "verbose_name": "job event",
                "verbose_name_plural": "job events",
                "db_table": "pgqueue_job_events",
                "ordering": ("-id",),
                "indexes": [models.Index(fields=["job", "id"], name="idx_job_events_job")],
            },
        ),
        migrations.RunSQL(
            sql=read_sql("job_events_job_fk_v1.sql"),
            reverse_sql="ALTER TABLE pgqueue_job_events DROP CONSTRAINT pgqueue_job_events_job_fk;",
        ),
        migrations.AlterModelOptions(
            name="job",
            options={
                "ordering": ("-created_at",),
                "permissions": [("retry_job", "Can retry, cancel and run jobs now")],
                "verbose_name": "job",
                "verbose_name_plural": "jobs",
            },
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(fields=["created_at", "id"], name="idx_jobs_created"),
        ),
    ]
