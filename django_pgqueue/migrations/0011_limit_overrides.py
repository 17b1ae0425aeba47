import django.core.validators
import django.db.models.functions.comparison
from django.db import migrations, models

# pgqueue_limits keeps the declared limit (written by workers) and an override (set by
# staff); the limit enforced, max_running, becomes a column the database computes from
# the two. In SQL, so that max_running keeps its values: the old column is renamed to
# declared, in one transaction that claims wait for (the table is a few rows).
FORWARD = """
ALTER TABLE pgqueue_limits DROP CONSTRAINT pgqueue_limits_max_running_positive;
ALTER TABLE pgqueue_limits RENAME COLUMN max_running TO declared;
ALTER TABLE pgqueue_limits ALTER COLUMN declared DROP NOT NULL;
ALTER TABLE pgqueue_limits ADD COLUMN override integer NULL;
ALTER TABLE pgqueue_limits
    ADD COLUMN max_running integer GENERATED ALWAYS AS (COALESCE(override, declared)) STORED;
ALTER TABLE pgqueue_limits ADD CONSTRAINT pgqueue_limits_declared_positive
    CHECK (declared IS NULL OR declared >= 1);
ALTER TABLE pgqueue_limits ADD CONSTRAINT pgqueue_limits_override_positive
    CHECK (override IS NULL OR override >= 1);
ALTER TABLE pgqueue_limits ADD CONSTRAINT pgqueue_limits_declared_or_override
    CHECK (declared IS NOT NULL OR override IS NOT NULL);
"""

# Back to one column holding the limit enforced now, overrides included.
BACKWARD = """
ALTER TABLE pgqueue_limits DROP CONSTRAINT pgqueue_limits_declared_positive;
ALTER TABLE pgqueue_limits DROP CONSTRAINT pgqueue_limits_override_positive;
ALTER TABLE pgqueue_limits DROP CONSTRAINT pgqueue_limits_declared_or_override;
UPDATE pgqueue_limits SET declared = max_running;
ALTER TABLE pgqueue_limits DROP COLUMN max_running;
ALTER TABLE pgqueue_limits DROP COLUMN override;
ALTER TABLE pgqueue_limits ALTER COLUMN declared SET NOT NULL;
ALTER TABLE pgqueue_limits RENAME COLUMN declared TO max_running;
ALTER TABLE pgqueue_limits ADD CONSTRAINT pgqueue_limits_max_running_positive
    CHECK (max_running >= 1);
"""


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgqueue", "0010_unique_recent_index"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(sql=FORWARD, reverse_sql=BACKWARD)],
            state_operations=[
                migrations.RemoveConstraint(
                    model_name="concurrencylimit", name="pgqueue_limits_max_running_positive"
                ),
                migrations.RemoveField(model_name="concurrencylimit", name="max_running"),
                migrations.AddField(
                    model_name="concurrencylimit",
                    name="declared",
                    field=models.IntegerField(blank=True, editable=False, null=True),
                ),
                migrations.AddField(
                    model_name="concurrencylimit",
                    name="override",
                    field=models.IntegerField(
                        blank=True,
                        help_text="Wins over the declared limit; empty: the declared limit applies.",
                        null=True,
                        validators=[
                            django.core.validators.MinValueValidator(1),
                            django.core.validators.MaxValueValidator(1000000),
                        ],
                    ),
                ),
                migrations.AddField(
                    model_name="concurrencylimit",
                    name="max_running",
                    field=models.GeneratedField(
                        db_persist=True,
                        expression=django.db.models.functions.comparison.Coalesce(
                            "override", "declared"
                        ),
                        output_field=models.IntegerField(),
                    ),
                ),
                migrations.AddConstraint(
                    model_name="concurrencylimit",
                    constraint=models.CheckConstraint(
                        condition=models.Q(("declared__isnull", True), ("declared__gte", 1), _connector="OR"),
                        name="pgqueue_limits_declared_positive",
                    ),
                ),
                migrations.AddConstraint(
                    model_name="concurrencylimit",
                    constraint=models.CheckConstraint(
                        condition=models.Q(("override__isnull", True), ("override__gte", 1), _connector="OR"),
                        name="pgqueue_limits_override_positive",
                    ),
                ),
                migrations.AddConstraint(
                    model_name="concurrencylimit",
                    constraint=models.CheckConstraint(
                        condition=models.Q(
                            ("declared__isnull", False), ("override__isnull", False), _connector="OR"
                        ),
                        name="pgqueue_limits_declared_or_override",
                    ),
                ),
            ],
        ),
    ]
