from django.db import migrations

from django_pgqueue.sqlfiles import read_sql


class Migration(migrations.Migration):
    # An atomic handler's completion names the claim it ends (its claimed_at): an
    # earlier run of a job recovered and claimed again by the same worker no longer
    # completes the later run (sql/complete_in_transaction_v2.sql). Version 1 stays for
    # workers of the previous release during a rolling deploy.

    dependencies = [
        ("django_pgqueue", "0045_claim_never_scans_the_table"),
    ]

    operations = [
        migrations.RunSQL(
            sql=read_sql("complete_in_transaction_v2.sql"),
            reverse_sql=(
                "DROP FUNCTION pgqueue_complete_in_transaction(uuid, timestamptz, text, float8);"
            ),
        ),
    ]
