from django.db import migrations

from django_pgqueue.sqlfiles import read_sql

# Versions 8 and 9 of the claim share a signature: the same DROP goes first, either way.
DROP_CLAIM = (
    "DROP FUNCTION claim_job_batch(text, text[], integer, text[], boolean, integer, "
    "double precision);"
)


class Migration(migrations.Migration):
    # claim_job_batch version 9: without any limit, the walk and the update in one
    # statement. Swapped in one transaction: a claimer sees version 8 or 9.

    dependencies = [
        ("django_pgqueue", "0017_rate_keys_hold_their_backlog"),
    ]

    operations = [
        migrations.RunSQL(sql=DROP_CLAIM, reverse_sql=read_sql("claim_job_batch_v8.sql")),
        migrations.RunSQL(sql=read_sql("claim_job_batch_v9.sql"), reverse_sql=DROP_CLAIM),
    ]
