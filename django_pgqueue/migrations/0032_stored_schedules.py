import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_pgqueue', '0031_spread_recovered_jobs'),
    ]

    operations = [
        migrations.CreateModel(
            name='StoredSchedule',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=255, unique=True, verbose_name='name')),
                ('job_type', models.CharField(max_length=200, verbose_name='job type')),
                ('schedule', models.CharField(help_text='A cron expression: minute hour day-of-month month day-of-week, such as “0 3 * * *” or “*/15 * * * *”, a sixth field for seconds, or @daily, @hourly…', max_length=150, verbose_name='schedule')),
                ('timezone', models.CharField(blank=True, default='', help_text="An IANA name such as “Europe/Paris”; blank: the site's TIME_ZONE.", max_length=64, verbose_name='time zone')),
                ('data', models.JSONField(blank=True, default=dict, verbose_name='data')),
                ('queue', models.CharField(blank=True, default='', help_text="Blank: the job type's queue.", max_length=100, verbose_name='queue')),
                ('priority', models.SmallIntegerField(blank=True, null=True, verbose_name='priority')),
                ('max_attempts', models.IntegerField(blank=True, null=True, verbose_name='max attempts')),
                ('unique_key', models.CharField(blank=True, default='', help_text='A tick is skipped while an active job holds this key; blank: none.', max_length=255, verbose_name='unique key')),
                ('created_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('updated_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
            options={
                'verbose_name': 'stored schedule',
                'verbose_name_plural': 'stored schedules',
                'db_table': 'pgqueue_schedules',
                'ordering': ('name',),
            },
        ),
        migrations.AddField(
            model_name='periodictick',
            name='paused_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
