import django.db.models.functions.datetime
from django.db import migrations, models

from django_pgqueue.sqlfiles import read_sql


class Migration(migrations.Migration):
    # Durable sleeps and waits for events (job.sleep(), job.wait_for_event(), emit_event()):
    # the kind and end of a checkpoint (two columns, no table rewrite), the emitted events
    # (a new, empty table) and the SQL functions of events (sql/events_v1.sql).

    dependencies = [
        ("django_pgqueue", "0028_job_steps"),
    ]

    operations = [
        migrations.CreateModel(
            name="EmittedEvent",
            fields=[
                ("name", models.CharField(max_length=200, primary_key=True, serialize=False)),
                ("payload", models.JSONField(blank=True, null=True)),
                (
                    "emitted_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
            ],
            options={
                "verbose_name": "emitted event",
                "verbose_name_plural": "emitted events",
                "db_table": "pgqueue_emitted_events",
                "ordering": ("-emitted_at",),
            },
        ),
        migrations.AddField(
            model_name="jobstep",
            name="kind",
            field=models.CharField(
                choices=[("step", "Step"), ("sleep", "Sleep"), ("event", "Wait for an event")],
                db_default="step",
                max_length=10,
            ),
        ),
        migrations.AddField(
            model_name="jobstep",
            name="wake_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="jobattempt",
            name="outcome",
            field=models.CharField(
                choices=[
                    ("retried", "Failed, retried"),
                    ("failed", "Failed"),
                    ("cancelled", "Cancelled"),
                    ("snoozed", "Snoozed"),
                    ("suspended", "Suspended (sleep or wait)"),
                    ("lost", "Lost with its worker"),
                ],
                max_length=20,
            ),
        ),
        migrations.AddIndex(
            model_name="jobstep",
            index=models.Index(
                condition=models.Q(("kind", "event"), ("result__isnull", True)),
                fields=["name"],
                name="pgqueue_job_steps_waiting",
            ),
        ),
        migrations.AddIndex(
            model_name="emittedevent",
            index=models.Index(fields=["emitted_at"], name="pgqueue_events_emitted_at"),
        ),
        migrations.RunSQL(
            sql=read_sql("events_v1.sql"),
            reverse_sql="DROP FUNCTION pgqueue_emit_event(text, jsonb, text);"
            "DROP FUNCTION pgqueue_await_event"
            "(uuid, text, integer, text, timestamptz, timestamptz);",
        ),
    ]
