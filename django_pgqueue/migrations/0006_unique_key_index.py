from django.db import migrations, models


class Migration(migrations.Migration):
    # The jobs table is live: build the unique index without locking out writers.
    atomic = False

    dependencies = [
        ("django_pgqueue", "0005_ops_features"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    sql=(
                        "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS pgqueue_jobs_unique_key_active "
                        "ON pgqueue_jobs (unique_key) "
                        "WHERE unique_key IS NOT NULL "
                        "AND status IN ('pending', 'claimed', 'running');"
                    ),
                    reverse_sql="DROP INDEX CONCURRENTLY IF EXISTS pgqueue_jobs_unique_key_active;",
                ),
            ],
            state_operations=[
                migrations.AddConstraint(
                    model_name="job",
                    constraint=models.UniqueConstraint(
                        condition=models.Q(
                            ("status__in", ["pending", "claimed", "running"]),
                            ("unique_key__isnull", False),
                        ),
                        fields=("unique_key",),
                        name="pgqueue_jobs_unique_key_active",
                    ),
                ),
            ],
        ),
    ]
