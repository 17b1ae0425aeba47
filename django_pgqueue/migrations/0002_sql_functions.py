from django.db import migrations

from django_pgqueue.sqlfiles import read_sql


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0001_initial")]

    operations = [
        migrations.RunSQL(
            sql=read_sql("claim_job_batch_v1.sql"),
            reverse_sql="DROP FUNCTION claim_job_batch(text, text[], integer, text[]);",
        ),
        migrations.RunSQL(
            sql=read_sql("recover_stale_jobs_v1.sql"),
            reverse_sql="DROP FUNCTION recover_stale_jobs(interval);",
        ),
    ]
