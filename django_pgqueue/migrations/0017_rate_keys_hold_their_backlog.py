from django.db import migrations

from django_pgqueue.sqlfiles import read_sql

# Back to version 1 of the per-key functions: dropped, then created as that file has it.
DROP_KEY_LIMITS_V2 = (
    "DROP FUNCTION pgqueue_release_held_jobs(); "
    "DROP FUNCTION pgqueue_release_held_keys(text[], text[]); "
    "DROP FUNCTION pgqueue_key_places();"
)


class Migration(migrations.Migration):
    # Keys under a per-key rate keep their due backlog beyond a window's worth out of
    # the claim index, as keys under a concurrency limit do (key_limits_v2.sql); claim
    # version 7 (migration 0015) releases their held jobs. Jobs already pending stay
    # visible until the sweep of a worker's recovery loop holds the excess.

    dependencies = [
        ("django_pgqueue", "0016_rate_hand_back"),
    ]

    operations = [
        migrations.RunSQL(
            sql=read_sql("key_limits_v2.sql"),
            reverse_sql=DROP_KEY_LIMITS_V2 + read_sql("key_limits_v1.sql"),
        ),
    ]
