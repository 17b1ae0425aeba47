import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models

from django_pgqueue.sqlfiles import read_sql


class Migration(migrations.Migration):
    # The checkpoints of durable steps (JobStep, job.step()): a new, empty table, unique
    # per job and step name, deleted with its job (the cascading foreign key).

    dependencies = [
        ("django_pgqueue", "0027_failed_index"),
    ]

    operations = [
        migrations.CreateModel(
            name="JobStep",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.CharField(max_length=200)),
                ("attempt", models.IntegerField()),
                ("result", models.JSONField(blank=True, null=True)),
                ("started_at", models.DateTimeField()),
                (
                    "completed_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                (
                    "job",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="steps",
                        to="django_pgqueue.job",
                    ),
                ),
            ],
            options={
                "verbose_name": "job step",
                "verbose_name_plural": "job steps",
                "db_table": "pgqueue_job_steps",
                "ordering": ("id",),
                "constraints": [
                    models.UniqueConstraint(
                        fields=("job", "name"), name="pgqueue_job_steps_unique_name"
                    )
                ],
            },
        ),
        migrations.RunSQL(
            sql=read_sql("job_steps_job_fk_v1.sql"),
            reverse_sql="ALTER TABLE pgqueue_job_steps DROP CONSTRAINT pgqueue_job_steps_job_fk;",
        ),
    ]
