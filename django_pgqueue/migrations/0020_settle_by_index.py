from django.db import migrations

from django_pgqueue.sqlfiles import read_sql


class Migration(migrations.Migration):
    # A finish looks up the edges of the jobs it finished one job at a time, through the
    # index, even before the edges table has statistics (workflow_settle_v2.sql).
    # Version 2 gives the same results as version 1 with other plans: migrating back
    # leaves it in place, and 0018 going back drops it with the rest.

    dependencies = [
        ("django_pgqueue", "0019_workflow_index"),
    ]

    operations = [
        migrations.RunSQL(
            sql=read_sql("workflow_settle_v2.sql"), reverse_sql=migrations.RunSQL.noop
        ),
    ]
