import django.db.models.deletion
from django.db import migrations, models

from django_pgqueue.sqlfiles import read_sql

OLD_STATES = "'pending', 'claimed', 'running', 'completed', 'failed', 'cancelled'"
NEW_STATES = f"'waiting', {OLD_STATES}"


def status_check(states: str, *, valid: bool) -> str:
    return (
        "ALTER TABLE pgqueue_jobs DROP CONSTRAINT pgqueue_jobs_status_valid, "
        f"ADD CONSTRAINT pgqueue_jobs_status_valid CHECK (status IN ({states}))"
        + ("" if valid else " NOT VALID")
        + ";"
    )


class Migration(migrations.Migration):
    # Workflow steps: the state "waiting", the column workflow_id, the dependency edges
    # and counters, and the triggers that settle the dependents of a finished job in its
    # own transaction (workflow_settle_v1.sql). The wider status check is added NOT VALID
    # here (no scan under the table's lock) and validated by 0019, with the index on
    # workflow_id built concurrently there.

    dependencies = [
        ("django_pgqueue", "0017_rate_keys_hold_their_backlog"),
    ]

    operations = [
        migrations.CreateModel(
            name="JobDependency",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "on_failure",
                    models.CharField(
                        choices=[
                            ("cancel", "Cancel"),
                            ("run", "Run anyway"),
                            ("run_only", "Run only then"),
                        ],
                        max_length=8,
                    ),
                ),
                (
                    "dependency",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="dependent_edges",
                        to="django_pgqueue.job",
                    ),
                ),
                (
                    "job",
                    models.ForeignKey(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="dependency_edges",
                        to="django_pgqueue.job",
                    ),
                ),
            ],
            options={
                "verbose_name": "job dependency",
                "verbose_name_plural": "job dependencies",
                "db_table": "pgqueue_job_dependencies",
                "constraints": [
                    models.UniqueConstraint(
                        fields=("dependency", "job"), name="pgqueue_job_dependencies_unique"
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("job", models.F("dependency")), _negated=True),
                        name="pgqueue_job_dependencies_not_self",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("on_failure__in", ["cancel", "run", "run_only"])),
                        name="pgqueue_job_dependencies_on_failure_valid",
                    ),
                ],
            },
        ),
        migrations.CreateModel(
            name="JobWait",
            fields=[
                (
                    "job",
                    models.OneToOneField(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        primary_key=True,
                        related_name="wait",
                        serialize=False,
                        to="django_pgqueue.job",
                    ),
                ),
                ("unresolved", models.IntegerField()),
                (
                    "cancelled_by",
                    models.ForeignKey(
                        blank=True,
                        db_constraint=False,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="+",
                        to="django_pgqueue.job",
                    ),
                ),
            ],
            options={
                "verbose_name": "job wait",
                "verbose_name_plural": "job waits",
                "db_table": "pgqueue_job_waits",
                "indexes": [
                    models.Index(
                        condition=models.Q(("cancelled_by__isnull", False)),
                        fields=["cancelled_by"],
                        name="idx_job_waits_cancelled_by",
                    )
                ],
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(("unresolved__gt", 0)),
                        name="pgqueue_job_waits_unresolved_positive",
                    )
                ],
            },
        ),
        migrations.AddField(
            model_name="job",
            name="workflow_id",
            field=models.UUIDField(blank=True, null=True),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(model_name="job", name="pgqueue_jobs_status_valid"),
                migrations.AlterField(
                    model_name="job",
                    name="status",
                    field=models.CharField(
                        choices=[
                            ("waiting", "Waiting"),
                            ("pending", "Pending"),
                            ("claimed", "Claimed"),
                            ("running", "Running"),
                            ("completed", "Completed"),
                            ("failed", "Failed"),
                            ("cancelled", "Cancelled"),
                        ],
                        db_default="pending",
                        max_length=16,
                    ),
                ),
                migrations.AddConstraint(
                    model_name="job",
                    constraint=models.CheckConstraint(
                        condition=models.Q(
                            (
                                "status__in",
                                [
                                    "waiting",
                                    "pending",
                                    "claimed",
                                    "running",
                                    "completed",
                                    "failed",
                                    "cancelled",
                                ],
                            )
                        ),
                        name="pgqueue_jobs_status_valid",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    sql=status_check(NEW_STATES, valid=False),
                    reverse_sql=status_check(OLD_STATES, valid=True),
                ),
            ],
        ),
        migrations.RunSQL(
            sql=read_sql("workflow_settle_v1.sql"),
            reverse_sql="""
                DROP TRIGGER pgqueue_jobs_settle ON pgqueue_jobs;
                DROP TRIGGER pgqueue_jobs_note_settlement ON pgqueue_jobs;
                DROP FUNCTION pgqueue_settle_statement();
                DROP FUNCTION pgqueue_note_settlement();
                DROP FUNCTION pgqueue_settle_jobs(uuid[], text[], text[]);
                DROP FUNCTION pgqueue_resume_dependents(uuid[]);
                DROP FUNCTION pgqueue_cancel_dependents(uuid[]);
                DROP FUNCTION pgqueue_edge_resolved(text, text);
                DROP TABLE pgqueue_job_settlements;
            """,
        ),
    ]
