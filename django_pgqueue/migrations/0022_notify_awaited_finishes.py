import django.db.models.deletion
from django.db import migrations, models

from django_pgqueue.sqlfiles import read_sql

DROP_NOTIFY_FINISHED = (
    "DROP TRIGGER pgqueue_jobs_notify_finished ON pgqueue_jobs; "
    "DROP FUNCTION pgqueue_notify_finished();"
)


class Migration(migrations.Migration):
    # Job.awaited, set by code waiting for a job's finish (Job.wait()), and the trigger
    # that notifies pgqueue_finished when an awaited job finishes
    # (notify_finished_v1.sql). A boolean with a constant default is added without
    # rewriting the table, however many jobs it holds.

    dependencies = [
        ("django_pgqueue", "0021_claim_skips_job_types"),
    ]

    operations = [
        # "wait" names Job.wait(): the reverse name of a job's workflow wait is now
        # workflow_wait (no change in the database).
        migrations.AlterField(
            model_name="jobwait",
            name="job",
            field=models.OneToOneField(
                db_constraint=False,
                on_delete=django.db.models.deletion.DO_NOTHING,
                primary_key=True,
                related_name="workflow_wait",
                serialize=False,
                to="django_pgqueue.job",
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="awaited",
            field=models.BooleanField(db_default=False),
        ),
        migrations.RunSQL(
            sql=read_sql("notify_finished_v1.sql"), reverse_sql=DROP_NOTIFY_FINISHED
        ),
    ]
