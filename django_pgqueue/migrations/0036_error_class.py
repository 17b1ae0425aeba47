from django.db import migrations, models

from django_pgqueue.sqlfiles import read_sql

DROP_ERROR_CLASS = (
    "DROP TRIGGER pgqueue_jobs_error_class ON pgqueue_jobs; "
    "DROP FUNCTION pgqueue_note_error_class(); "
    "DROP FUNCTION pgqueue_error_class(text);"
)

# The rows that already hold an error get their class; a column with a constant default
# is added without rewriting the table, and only these rows are written.
FILL_ERROR_CLASS = (
    "UPDATE pgqueue_jobs SET error_class = pgqueue_error_class(last_error) "
    "WHERE last_error <> ''"
)


class Migration(migrations.Migration):
    # Job.error_class, which the database keeps from last_error (error_class_v1.sql), for
    # the admin's errors page; 0037 puts it in idx_jobs_failed.

    dependencies = [
        ("django_pgqueue", "0035_failed_index_holds_queue"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="error_class",
            field=models.CharField(blank=True, db_default="", editable=False, max_length=200),
        ),
        migrations.RunSQL(sql=read_sql("error_class_v1.sql"), reverse_sql=DROP_ERROR_CLASS),
        migrations.RunSQL(sql=FILL_ERROR_CLASS, reverse_sql=migrations.RunSQL.noop),
    ]
