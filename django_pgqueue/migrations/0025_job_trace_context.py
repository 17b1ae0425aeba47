from django.db import migrations, models


class Migration(migrations.Migration):
    # Job.trace_context: the OpenTelemetry context of the enqueue, continued by each run
    # (PGQUEUE["OPENTELEMETRY"]). A nullable column is added without rewriting the table;
    # claim_job_batch returns whole rows (RETURNING jobs.*), so workers read it unasked.

    dependencies = [
        ("django_pgqueue", "0024_rate_window"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="trace_context",
            field=models.JSONField(blank=True, editable=False, null=True),
        ),
    ]
