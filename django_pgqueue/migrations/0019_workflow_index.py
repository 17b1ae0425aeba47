from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    # Outside a transaction: the jobs table stays writable while the status check of
    # 0018 is validated and the index of workflow steps is built.
    atomic = False

    dependencies = [
        ("django_pgqueue", "0018_job_dependencies"),
    ]

    operations = [
        migrations.RunSQL(
            sql="ALTER TABLE pgqueue_jobs VALIDATE CONSTRAINT pgqueue_jobs_status_valid;",
            reverse_sql=migrations.RunSQL.noop,
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("workflow_id__isnull", False)),
                fields=["workflow_id", "created_at"],
                name="idx_jobs_workflow",
            ),
        ),
    ]
