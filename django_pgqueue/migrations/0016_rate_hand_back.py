from django.db import migrations

from django_pgqueue.sqlfiles import read_sql


class Migration(migrations.Migration):
    # The function a worker calls when it hands back prefetched rate-limited jobs it
    # could not start in time: their room in their limits' windows goes back with them.

    dependencies = [
        ("django_pgqueue", "0015_claim_reads_marks_by_index"),
    ]

    operations = [
        migrations.RunSQL(
            sql=read_sql("rate_hand_back_v1.sql"),
            reverse_sql="DROP FUNCTION pgqueue_rate_hand_back(uuid[], text);",
        ),
    ]
