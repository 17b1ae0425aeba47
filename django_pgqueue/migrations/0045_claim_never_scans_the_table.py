from django.db import migrations

from django_pgqueue.sqlfiles import read_sql


class Migration(migrations.Migration):
    # claim_job_batch_v12.sql: version 11 with sequential scans off, so that a plan
    # cached while the table was empty cannot read the whole table at every claim.
    # CREATE OR REPLACE in the migration's transaction: a claimer sees version 11 or 12.

    dependencies = [
        ("django_pgqueue", "0044_filter_indexes"),
    ]

    operations = [
        migrations.RunSQL(
            sql=read_sql("claim_job_batch_v12.sql"),
            reverse_sql=read_sql("claim_job_batch_v11.sql"),
        ),
    ]
