from django.db import migrations

SIGNATURE = (
    "claim_job_batch(text, text[], integer, text[], boolean, integer, double precision, text[])"
)


class Migration(migrations.Migration):
    # Sequential scans off inside claim_job_batch (version 11, claim_job_batch_v11.sql).
    # Version 11 caches the plan of a claim that filters nothing for the session. A
    # worker's first claims often find an empty table (a new install, a quiet queue):
    # planned then, the update read the whole table for the rows the walk had locked (a
    # Seq Scan filtered on ctid = ANY, cheaper than a TID scan on a table of no rows),
    # and every later claim of that session did the same until autovacuum's next
    # ANALYZE. Every statement of the claim has an index to read through. A later
    # version of the function must keep the setting: tests/test_claim.py checks it.

    dependencies = [
        ("django_pgqueue", "0044_filter_indexes"),
    ]

    operations = [
        migrations.RunSQL(
            sql=f"ALTER FUNCTION {SIGNATURE} SET enable_seqscan = off",
            reverse_sql=f"ALTER FUNCTION {SIGNATURE} RESET enable_seqscan",
        ),
    ]
