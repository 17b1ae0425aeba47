from django.db import migrations

from django_pgqueue.sqlfiles import read_sql

DROP_RATE_WINDOW = (
    "DROP FUNCTION pgqueue_rate_window(text, text, integer, integer, timestamp with time zone);"
    "DROP FUNCTION pgqueue_rate_limit_name(text, text);"
    "DROP FUNCTION pgqueue_rate_limits_of(text, text, text);"
)
DROP_RATE_HAND_BACK = "DROP FUNCTION pgqueue_rate_hand_back(uuid[], text);"
DROP_CLAIM = (
    "DROP FUNCTION claim_job_batch(text, text[], integer, text[], boolean, integer, "
    "double precision, text[]);"
)


class Migration(migrations.Migration):
    # The rules of rate limits' windows, defined once each (rate_window_v1.sql: which
    # windows count a job, what a window holds, which limit a window belongs to) and
    # read by the claim (version 9, claim_job_batch_v9.sql), pgqueue_rate_limit_wait()
    # (rate_limits_v3.sql) and pgqueue_rate_hand_back() (rate_hand_back_v2.sql).
    # Version 9 has version 8's signature; all of it runs in the migration's
    # transaction, so a claimer sees version 8 or 9, never neither.

    dependencies = [
        ("django_pgqueue", "0023_job_timeout"),
    ]

    operations = [
        migrations.RunSQL(sql=read_sql("rate_window_v1.sql"), reverse_sql=DROP_RATE_WINDOW),
        migrations.RunSQL(sql=DROP_CLAIM, reverse_sql=read_sql("claim_job_batch_v8.sql")),
        migrations.RunSQL(sql=read_sql("claim_job_batch_v9.sql"), reverse_sql=DROP_CLAIM),
        migrations.RunSQL(
            sql=read_sql("rate_limits_v3.sql"), reverse_sql=read_sql("rate_limits_v2.sql")
        ),
        migrations.RunSQL(
            sql=read_sql("rate_hand_back_v2.sql"),
            reverse_sql=DROP_RATE_HAND_BACK + read_sql("rate_hand_back_v1.sql"),
        ),
    ]
