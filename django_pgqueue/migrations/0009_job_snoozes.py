from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgqueue", "0008_claim_in_due_time_order"),
    ]

    operations = [
        # A constant default: PostgreSQL adds the column without rewriting the table.
        migrations.AddField(
            model_name="job",
            name="snoozes",
            field=models.IntegerField(db_default=0),
        ),
    ]
