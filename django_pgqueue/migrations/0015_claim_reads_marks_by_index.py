from django.db import migrations, models

from django_pgqueue.sqlfiles import read_sql

# Versions 6 and 7 share a signature: the same DROP goes first, either way.
DROP_CLAIM = (
    "DROP FUNCTION claim_job_batch(text, text[], integer, text[], boolean, integer, "
    "double precision);"
)


class Migration(migrations.Migration):
    # The marks of full windows, indexed by scope first, and the claim that reads them
    # through that index (version 7, which also releases the held jobs of per-key rates
    # and claims in one statement while no limit exists: claim_job_batch_v7.sql). Every claim and wake-up query reads "scope = 'key'
    # AND full_until > now"; with the index on full_until alone, the planner (misled by
    # the statistics of a log that grows by a hundred rows a claim, and in the claim by
    # version 6's DISTINCT under enable_sort = off) read every key's starts through the
    # primary key: a millisecond a query with a thousand keys. The log is small
    # (recovery prunes it), so the index is built in the migration's transaction, with
    # the claim swapped in the same one: a claimer sees version 6 or 7, never neither.

    dependencies = [
        ("django_pgqueue", "0014_claim_prefetches_rated_jobs"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="ratelimitstart",
            index=models.Index(
                condition=models.Q(full_until__isnull=False),
                fields=["scope", "full_until"],
                name="idx_rate_starts_marks",
            ),
        ),
        migrations.RemoveIndex(model_name="ratelimitstart", name="idx_rate_starts_full"),
        migrations.RunSQL(sql=DROP_CLAIM, reverse_sql=read_sql("claim_job_batch_v6.sql")),
        migrations.RunSQL(sql=read_sql("claim_job_batch_v7.sql"), reverse_sql=DROP_CLAIM),
    ]
