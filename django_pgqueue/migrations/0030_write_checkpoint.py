from django.db import migrations

from django_pgqueue.sqlfiles import read_sql


class Migration(migrations.Migration):
    # Steps write their checkpoints through a SQL function (sql/steps_v1.sql), whose
    # plan the connection keeps: about half the cost of a step's checkpoint.

    dependencies = [
        ("django_pgqueue", "0029_sleeps_and_events"),
    ]

    operations = [
        migrations.RunSQL(
            sql=read_sql("steps_v1.sql"),
            reverse_sql="DROP FUNCTION pgqueue_write_checkpoint"
            "(uuid, text, integer, text, text, jsonb, timestamptz, timestamptz, boolean);",
        ),
    ]
