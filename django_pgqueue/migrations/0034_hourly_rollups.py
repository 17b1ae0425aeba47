import django_pgqueue.models.rollups
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_pgqueue', '0033_rollups'),
    ]

    operations = [
        migrations.CreateModel(
            name='HourJobs',
            fields=[
                ('pk', models.CompositePrimaryKey('hour', 'queue', 'job_type', blank=True, editable=False, primary_key=True, serialize=False)),
                ('hour', models.DateTimeField()),
                ('queue', models.CharField(max_length=100)),
                ('job_type', models.CharField(max_length=200)),
                ('completed', models.IntegerField(default=0)),
                ('failed', models.IntegerField(default=0)),
                ('cancelled', models.IntegerField(default=0)),
                ('wait_ms', django_pgqueue.models.rollups.IntegerArrayField(default=list)),
                ('run_ms', django_pgqueue.models.rollups.IntegerArrayField(default=list)),
            ],
            options={
                'verbose_name': 'hour of finished jobs',
                'verbose_name_plural': 'hours of finished jobs',
                'db_table': 'pgqueue_hour_jobs',
                'ordering': ('-hour', 'queue', 'job_type'),
            },
        ),
    ]
