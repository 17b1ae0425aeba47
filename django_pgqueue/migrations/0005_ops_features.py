import django.db.models.functions.datetime
from django.db import migrations, models

from django_pgqueue.sqlfiles import read_sql


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgqueue", "0004_finished_index"),
    ]

    operations = [
        migrations.CreateModel(
            name="ConcurrencyLimit",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("scope", models.CharField(choices=[("queue", "Queue"), ("job_type", "Job type")], max_length=16)),
                ("name", models.CharField(max_length=255)),
                ("max_running", models.IntegerField()),
                ("updated_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
            options={
                "verbose_name": "concurrency limit",
                "verbose_name_plural": "concurrency limits",
                "db_table": "pgqueue_limits",
                "ordering": ("scope", "name"),
                "constraints": [
                    models.UniqueConstraint(fields=("scope", "name"), name="pgqueue_limits_scope_name"),
                    models.CheckConstraint(
                        condition=models.Q(("scope__in", ["queue", "job_type"])), name="pgqueue_limits_scope_valid"
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("max_running__gte", 1)), name="pgqueue_limits_max_running_positive"
                    ),
                ],
            },
        ),
        migrations.CreateModel(
            name="PeriodicTick",
            fields=[
                ("name", models.CharField(max_length=255, primary_key=True, serialize=False)),
                ("schedule", models.CharField(max_length=255)),
                ("last_tick", models.DateTimeField()),
                ("last_job_id", models.UUIDField(blank=True, null=True)),
                ("updated_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
            options={
                "verbose_name": "periodic job",
                "verbose_name_plural": "periodic jobs",
                "db_table": "pgqueue_periodic",
                "ordering": ("name",),
            },
        ),
        migrations.CreateModel(
            name="QueueState",
            fields=[
                ("name", models.CharField(max_length=100, primary_key=True, serialize=False)),
                ("paused_at", models.DateTimeField(blank=True, null=True)),
                ("updated_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
            options={
                "verbose_name": "queue state",
                "verbose_name_plural": "queue states",
                "db_table": "pgqueue_queues",
                "ordering": ("name",),
            },
        ),
        # Nullable with no default: adding it rewrites nothing.
        migrations.AddField(
            model_name="job",
            name="unique_key",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.RunSQL(
            # Version 2 adds an argument (p_start): the file drops version 1 first.
            sql=read_sql("claim_job_batch_v2.sql"),
            reverse_sql=[
                "DROP FUNCTION claim_job_batch(text, text[], integer, text[], boolean);",
                read_sql("claim_job_batch_v1.sql"),
            ],
        ),
    ]
