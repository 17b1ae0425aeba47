from django.db import migrations, models


class Migration(migrations.Migration):
    # Job.timeout: a job's own timeout (enqueue(timeout=...)), over its type's. A
    # nullable column is added without rewriting the table.

    dependencies = [
        ("django_pgqueue", "0022_notify_awaited_finishes"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="timeout",
            field=models.FloatField(blank=True, null=True),
        ),
    ]
