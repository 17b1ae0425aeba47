import django.db.models.functions.comparison
import django.db.models.functions.datetime
from django.db import migrations, models

from django_pgqueue.sqlfiles import read_sql

# Version 5 has a new parameter: a new signature, so version 4 goes first (and back).
DROP_CLAIM_V5 = "DROP FUNCTION claim_job_batch(text, text[], integer, text[], boolean, integer);"
DROP_CLAIM_V4 = "DROP FUNCTION claim_job_batch(text, text[], integer, text[], boolean);"


class Migration(migrations.Migration):
    # Two new tables, and the claim swapped in one transaction: a claimer sees version 4
    # or version 5, never neither.

    dependencies = [
        ("django_pgqueue", "0012_per_key_limits"),
    ]

    operations = [
        migrations.CreateModel(
            name="RateLimit",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "scope",
                    models.CharField(
                        choices=[
                            ("queue", "Queue"),
                            ("job_type", "Job type"),
                            ("key", "Each key of a job type"),
                        ],
                        max_length=16,
                    ),
                ),
                ("name", models.CharField(max_length=255)),
                ("declared_jobs", models.IntegerField(blank=True, editable=False, null=True)),
                ("declared_seconds", models.IntegerField(blank=True, editable=False, null=True)),
                ("override_jobs", models.IntegerField(blank=True, null=True)),
                ("override_seconds", models.IntegerField(blank=True, null=True)),
                (
                    "max_jobs",
                    models.GeneratedField(
                        db_persist=True,
                        expression=django.db.models.functions.comparison.Coalesce(
                            "override_jobs", "declared_jobs"
                        ),
                        output_field=models.IntegerField(),
                    ),
                ),
                (
                    "period_seconds",
                    models.GeneratedField(
                        db_persist=True,
                        expression=models.Case(
                            models.When(override_jobs__isnull=False, then="override_seconds"),
                            default="declared_seconds",
                        ),
                        output_field=models.IntegerField(),
                    ),
                ),
                (
                    "updated_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
            ],
            options={
                "verbose_name": "rate limit",
                "verbose_name_plural": "rate limits",
                "db_table": "pgqueue_rate_limits",
                "ordering": ("scope", "name"),
                "constraints": [
                    models.UniqueConstraint(
                        fields=("scope", "name"), name="pgqueue_rate_limits_scope_name"
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("scope__in", ["queue", "job_type", "key"])),
                        name="pgqueue_rate_limits_scope_valid",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            models.Q(
                                ("declared_jobs__isnull", True), ("declared_seconds__isnull", True)
                            ),
                            models.Q(
                                ("declared_jobs__range", (1, 1000000)),
                                ("declared_seconds__range", (1, 604800)),
                            ),
                            _connector="OR",
                        ),
                        name="pgqueue_rate_limits_declared_valid",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            models.Q(
                                ("override_jobs__isnull", True), ("override_seconds__isnull", True)
                            ),
                            models.Q(
                                ("override_jobs__range", (1, 1000000)),
                                ("override_seconds__range", (1, 604800)),
                            ),
                            _connector="OR",
                        ),
                        name="pgqueue_rate_limits_override_valid",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            ("declared_jobs__isnull", False),
                            ("override_jobs__isnull", False),
                            _connector="OR",
                        ),
                        name="pgqueue_rate_limits_declared_or_override",
                    ),
                ],
            },
        ),
        migrations.CreateModel(
            name="RateLimitStart",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "scope",
                        "name",
                        "started_at",
                        blank=True,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("scope", models.CharField(max_length=16)),
                ("name", models.CharField(max_length=255)),
                ("started_at", models.DateTimeField()),
                ("jobs", models.IntegerField()),
            ],
            options={
                "verbose_name": "rate limit start",
                "verbose_name_plural": "rate limit starts",
                "db_table": "pgqueue_rate_starts",
                "indexes": [
                    models.Index(
                        condition=models.Q(("scope", "key")),
                        fields=["started_at"],
                        name="idx_rate_starts_keys",
                    )
                ],
            },
        ),
        migrations.RunSQL(sql=DROP_CLAIM_V4, reverse_sql=read_sql("claim_job_batch_v4.sql")),
        migrations.RunSQL(sql=read_sql("claim_job_batch_v5.sql"), reverse_sql=DROP_CLAIM_V5),
        migrations.RunSQL(
            sql=read_sql("rate_limits_v1.sql"),
            reverse_sql="DROP FUNCTION pgqueue_rate_limit_wait(text[], text[]);",
        ),
    ]
