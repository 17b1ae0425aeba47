from django.db import migrations

from django_pgqueue.sqlfiles import read_sql

DROP_CLAIM_V7 = (
    "DROP FUNCTION claim_job_batch(text, text[], integer, text[], boolean, integer, "
    "double precision);"
)
DROP_CLAIM_V8 = (
    "DROP FUNCTION claim_job_batch(text, text[], integer, text[], boolean, integer, "
    "double precision, text[]);"
)


class Migration(migrations.Migration):
    # The claim that can leave out job types (version 8, claim_job_batch_v8.sql): a
    # worker whose async slots are all busy claims every type but the async ones. Both
    # statements run in the migration's transaction: a claimer sees version 7 or 8,
    # never neither.

    dependencies = [
        ("django_pgqueue", "0020_settle_by_index"),
    ]

    operations = [
        migrations.RunSQL(sql=DROP_CLAIM_V7, reverse_sql=read_sql("claim_job_batch_v7.sql")),
        migrations.RunSQL(sql=read_sql("claim_job_batch_v8.sql"), reverse_sql=DROP_CLAIM_V8),
    ]
