from django.db import migrations, models

from django_pgqueue.sqlfiles import read_sql

# Version 6 has a new parameter: a new signature, so version 5 goes first (and back).
DROP_CLAIM_V6 = (
    "DROP FUNCTION claim_job_batch(text, text[], integer, text[], boolean, integer, "
    "double precision);"
)
DROP_CLAIM_V5 = "DROP FUNCTION claim_job_batch(text, text[], integer, text[], boolean, integer);"
DROP_RATE_LIMIT_WAIT = "DROP FUNCTION pgqueue_rate_limit_wait(text[], text[]);"


class Migration(migrations.Migration):
    # The marks of full windows, and the claim swapped in one transaction: a claimer
    # sees version 5 or version 6, never neither. The wait function (version 2, the same
    # signature) is replaced in place.

    dependencies = [
        ("django_pgqueue", "0013_rate_limits"),
    ]

    operations = [
        migrations.AddField(
            model_name="ratelimitstart",
            name="full_until",
            field=models.DateTimeField(blank=True, null=True),
        ),
        # Read by claim version 5 only, to sum every key's recent starts; the marks
        # replace it, and each claim under per-key rates writes a hundred rows.
        migrations.RemoveIndex(model_name="ratelimitstart", name="idx_rate_starts_keys"),
        migrations.AddIndex(
            model_name="ratelimitstart",
            index=models.Index(
                condition=models.Q(full_until__isnull=False),
                fields=["full_until"],
                name="idx_rate_starts_full",
            ),
        ),
        migrations.RunSQL(sql=DROP_CLAIM_V5, reverse_sql=read_sql("claim_job_batch_v5.sql")),
        migrations.RunSQL(sql=read_sql("claim_job_batch_v6.sql"), reverse_sql=DROP_CLAIM_V6),
        migrations.RunSQL(
            sql=read_sql("rate_limits_v2.sql"),
            reverse_sql=DROP_RATE_LIMIT_WAIT + read_sql("rate_limits_v1.sql"),
        ),
    ]
