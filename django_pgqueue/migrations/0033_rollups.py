import django_pgqueue.models.rollups
import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_pgqueue', '0032_stored_schedules'),
    ]

    operations = [
        migrations.CreateModel(
            name='MinuteJobs',
            fields=[
                ('pk', models.CompositePrimaryKey('minute', 'queue', 'job_type', blank=True, editable=False, primary_key=True, serialize=False)),
                ('minute', models.DateTimeField()),
                ('queue', models.CharField(max_length=100)),
                ('job_type', models.CharField(max_length=200)),
                ('completed', models.IntegerField(default=0)),
                ('failed', models.IntegerField(default=0)),
                ('cancelled', models.IntegerField(default=0)),
                ('wait_ms', django_pgqueue.models.rollups.IntegerArrayField(default=list)),
                ('run_ms', django_pgqueue.models.rollups.IntegerArrayField(default=list)),
            ],
            options={
                'verbose_name': 'minute of finished jobs',
                'verbose_name_plural': 'minutes of finished jobs',
                'db_table': 'pgqueue_minute_jobs',
                'ordering': ('-minute', 'queue', 'job_type'),
            },
        ),
        migrations.CreateModel(
            name='QueueMinute',
            fields=[
                ('minute', models.DateTimeField(primary_key=True, serialize=False)),
                ('depths', models.JSONField(default=dict)),
                ('written_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
            options={
                'verbose_name': 'sampled minute',
                'verbose_name_plural': 'sampled minutes',
                'db_table': 'pgqueue_minutes',
                'ordering': ('-minute',),
            },
        ),
    ]
