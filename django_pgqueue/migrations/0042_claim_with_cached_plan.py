from django.db import migrations

from django_pgqueue.sqlfiles import read_sql

DROP_V10 = (
    "DROP FUNCTION claim_job_batch(text, text[], integer, text[], boolean, integer, "
    "double precision, text[]); DROP FUNCTION pgqueue_holds_lost_job(text);"
)


class Migration(migrations.Migration):
    # claim_job_batch_v11.sql: the same signature as version 10, the claim of a worker
    # that filters nothing on a plan cached for the session. CREATE OR REPLACE in the
    # migration's transaction: a claimer sees version 10 or 11.

    dependencies = [
        ("django_pgqueue", "0041_lost_with_worker"),
    ]

    operations = [
        migrations.RunSQL(
            sql=read_sql("claim_job_batch_v11.sql"),
            reverse_sql=DROP_V10 + read_sql("claim_job_batch_v10.sql"),
        ),
    ]
