from django.db import migrations, models

from django_pgqueue.sqlfiles import read_sql

DROP_CLAIM = (
    "DROP FUNCTION claim_job_batch(text, text[], integer, text[], boolean, integer, "
    "double precision, text[]);"
)


class Migration(migrations.Migration):
    # Job.lost_with_worker, set by recovery on the running jobs it takes back
    # (recover_stale_jobs_v4.sql), and a claim that gives a worker at most one such job
    # at a time (claim_job_batch_v10.sql, the same signature as version 9), so that a
    # job that kills its worker does not take one that died beside it before along
    # again. The column has a constant default: it is added without rewriting the table.
    # All of it runs in the migration's transaction: a claimer sees version 9 or 10.

    dependencies = [
        ("django_pgqueue", "0040_complete_in_transaction"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="lost_with_worker",
            field=models.BooleanField(db_default=False, editable=False),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(
                    ("lost_with_worker", True), ("status__in", ["claimed", "running"])
                ),
                fields=["worker_id"],
                name="idx_jobs_lost_in_flight",
            ),
        ),
        migrations.RunSQL(
            sql=read_sql("recover_stale_jobs_v4.sql"),
            reverse_sql=read_sql("recover_stale_jobs_v3.sql"),
        ),
        migrations.RunSQL(sql=DROP_CLAIM, reverse_sql=read_sql("claim_job_batch_v9.sql")),
        migrations.RunSQL(
            sql=read_sql("claim_job_batch_v10.sql"),
            reverse_sql=DROP_CLAIM + "DROP FUNCTION pgqueue_holds_lost_job(text);",
        ),
    ]
