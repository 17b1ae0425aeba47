from django.db import migrations


class Migration(migrations.Migration):
    # Room on each page for a job's next versions: its claim and its completion then
    # mostly stay on the page, logged as the bytes that changed instead of the whole row,
    # and without the lock record that an update to another page writes first. A storage
    # parameter only: nothing is rewritten, pages filled from now on follow it, and the
    # SHARE UPDATE EXCLUSIVE lock it takes holds up no enqueue, claim or completion.
    # bench/cost.py: a drained job's WAL 1,801 -> 1,681 bytes (bench/results/issue28/).

    dependencies = [
        ("django_pgqueue", "0042_claim_with_cached_plan"),
    ]

    operations = [
        migrations.RunSQL(
            sql="ALTER TABLE pgqueue_jobs SET (fillfactor = 70)",
            reverse_sql="ALTER TABLE pgqueue_jobs RESET (fillfactor)",
        ),
    ]
