from django.db import migrations

from django_pgqueue.sqlfiles import read_sql


class Migration(migrations.Migration):
    # Running jobs taken back from a dead worker are due again after a random delay
    # (sql/recover_stale_jobs_v3.sql), so that a job that kills its worker does not take
    # the same batch-mates with it on every attempt.

    dependencies = [
        ("django_pgqueue", "0030_write_checkpoint"),
    ]

    operations = [
        migrations.RunSQL(
            sql=read_sql("recover_stale_jobs_v3.sql"),
            reverse_sql=read_sql("recover_stale_jobs_v2.sql"),
        ),
    ]
