from django.db import migrations

from django_pgqueue.sqlfiles import read_sql

# Version 6 has a new parameter: a new signature, so version 5 goes first (and back).
DROP_CLAIM_V6 = (
    "DROP FUNCTION claim_job_batch(text, text[], integer, text[], boolean, integer, "
    "double precision);"
)
DROP_CLAIM_V5 = "DROP FUNCTION claim_job_batch(text, text[], integer, text[], boolean, integer);"


class Migration(migrations.Migration):
    # The claim swapped in one transaction: a claimer sees version 5 or version 6,
    # never neither.

    dependencies = [
        ("django_pgqueue", "0013_rate_limits"),
    ]

    operations = [
        migrations.RunSQL(sql=DROP_CLAIM_V5, reverse_sql=read_sql("claim_job_batch_v5.sql")),
        migrations.RunSQL(sql=read_sql("claim_job_batch_v6.sql"), reverse_sql=DROP_CLAIM_V6),
    ]
