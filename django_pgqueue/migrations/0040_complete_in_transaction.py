from django.db import migrations

from django_pgqueue.sqlfiles import read_sql


class Migration(migrations.Migration):
    # An atomic handler's completion, written in its transaction, through a function
    # whose plan the session keeps (sql/complete_in_transaction_v1.sql).

    dependencies = [
        ("django_pgqueue", "0039_write_checkpoints"),
    ]

    operations = [
        migrations.RunSQL(
            sql=read_sql("complete_in_transaction_v1.sql"),
            reverse_sql="DROP FUNCTION pgqueue_complete_in_transaction(uuid, text, float8);",
        ),
    ]
