from django.db import migrations

from django_pgqueue.sqlfiles import read_sql


class Migration(migrations.Migration):
    # A worker writes the checkpoints of plain steps that its slots finished meanwhile
    # in one transaction (sql/steps_v2.sql), instead of one each.

    dependencies = [
        ("django_pgqueue", "0038_steps_cascade_by_trigger"),
    ]

    operations = [
        migrations.RunSQL(
            sql=read_sql("steps_v2.sql"),
            reverse_sql="DROP FUNCTION pgqueue_write_checkpoints"
            "(uuid[], text[], integer[], text[], jsonb[], float8[], float8[]);",
        ),
    ]
