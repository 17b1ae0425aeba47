from django.db import migrations

# Autovacuum visits the jobs table after 1 % of its rows (plus 1,000) are dead, instead
# of PostgreSQL's default 20 % (plus 50). Every claim and every outcome leaves a dead row
# version and dead index entries; in idx_jobs_claimable they gather at the front of the
# index, where each claim's walk starts and has to step over them until VACUUM removes
# them. On a table of a million finished jobs the default waited for 200,000 dead rows.
# See docs/explanation/performance.md. ALTER TABLE ... SET takes a lock that reads and
# writes do not wait for.
AUTOVACUUM = {
    "autovacuum_vacuum_scale_factor": "0.01",
    "autovacuum_vacuum_threshold": "1000",
    "autovacuum_analyze_scale_factor": "0.02",
    "autovacuum_analyze_threshold": "1000",
}


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgqueue", "0006_unique_key_index"),
    ]

    operations = [
        migrations.RunSQL(
            sql="ALTER TABLE pgqueue_jobs SET ("
            + ", ".join(f"{name} = {value}" for name, value in AUTOVACUUM.items())
            + ");",
            reverse_sql=f"ALTER TABLE pgqueue_jobs RESET ({', '.join(AUTOVACUUM)});",
        ),
    ]
