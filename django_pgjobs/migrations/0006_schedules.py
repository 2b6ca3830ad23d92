# Periodic schedules: the Schedule table, and the job columns that tie a job to its tick.

import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('pgjobs', '0005_lifecycle'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='scheduled_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='operatoraction',
            name='schedule_ids',
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.AlterField(
            model_name='operatoraction',
            name='action',
            field=models.CharField(choices=[('retry', 'retry'), ('replay', 'replay'), ('cancel', 'cancel'), ('dead_letter', 'dead-letter'), ('view_raw_payload', 'view raw payload'), ('pause_queue', 'pause queue'), ('resume_queue', 'resume queue'), ('schedule_create', 'create schedule'), ('schedule_change', 'change schedule'), ('schedule_pause', 'pause schedule'), ('schedule_resume', 'resume schedule'), ('schedule_run_now', 'run schedule now')], max_length=32),
        ),
        migrations.CreateModel(
            name='Schedule',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('name', models.CharField(max_length=200, unique=True)),
                ('task', models.CharField(max_length=200)),
                ('cron', models.CharField(max_length=100)),
                ('timezone', models.CharField(default='UTC', max_length=64)),
                ('payload', models.JSONField(blank=True, default=dict)),
                ('queue', models.CharField(blank=True, default='', max_length=64)),
                ('priority', models.SmallIntegerField(blank=True, null=True)),
                ('misfire', models.CharField(choices=[('skip', 'skip: only the latest missed tick runs'), ('catch_up', 'catch up: every missed tick runs, up to the catch-up limit'), ('none', 'none: missed ticks do not run')], default='skip', max_length=16)),
                ('catch_up_limit', models.PositiveIntegerField(default=100)),
                ('overlap', models.CharField(choices=[('allow', "allow: a tick runs even while the previous tick's job has not finished"), ('skip', "skip: a tick is skipped while the previous tick's job waits or runs")], default='allow', max_length=16)),
                ('source', models.CharField(choices=[('code', 'code (@job)'), ('settings', 'settings (PGJOBS_SCHEDULES)'), ('admin', 'admin')], default='admin', max_length=16)),
                ('paused_at', models.DateTimeField(blank=True, null=True)),
                ('retired_at', models.DateTimeField(blank=True, null=True)),
                ('next_tick_at', models.DateTimeField(blank=True, null=True)),
                ('last_tick_at', models.DateTimeField(blank=True, null=True)),
                ('last_handled_at', models.DateTimeField(blank=True, null=True)),
                ('last_job_id', models.BigIntegerField(blank=True, null=True)),
                ('ticks_enqueued', models.PositiveBigIntegerField(default=0)),
                ('ticks_missed', models.PositiveBigIntegerField(default=0)),
                ('ticks_skipped', models.PositiveBigIntegerField(default=0)),
                ('last_skipped_at', models.DateTimeField(blank=True, null=True)),
                ('last_skip_reason', models.CharField(blank=True, choices=[('overlap', 'overlap'), ('misfire', 'misfire')], default='', max_length=16)),
                ('created_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('updated_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
            options={
                'db_table': 'pgjobs_schedule',
                'permissions': [('pause_schedule', 'Can pause schedules'), ('resume_schedule', 'Can resume schedules'), ('run_schedule', 'Can run a schedule now')],
                'indexes': [models.Index(condition=models.Q(('next_tick_at__isnull', False), ('paused_at__isnull', True), ('retired_at__isnull', True)), fields=['next_tick_at'], name='pgjobs_schedule_due_idx')],
                'constraints': [models.CheckConstraint(condition=models.Q(('misfire__in', ['skip', 'catch_up', 'none'])), name='pgjobs_schedule_misfire_valid'), models.CheckConstraint(condition=models.Q(('overlap__in', ['allow', 'skip'])), name='pgjobs_schedule_overlap_valid'), models.CheckConstraint(condition=models.Q(('source__in', ['code', 'settings', 'admin'])), name='pgjobs_schedule_source_valid'), models.CheckConstraint(condition=models.Q(('priority__isnull', True), models.Q(('priority__gte', -100), ('priority__lte', 100)), _connector='OR'), name='pgjobs_schedule_priority_range'), models.CheckConstraint(condition=models.Q(('catch_up_limit__gte', 1)), name='pgjobs_schedule_catch_up_limit')],
            },
        ),
        migrations.AddField(
            model_name='job',
            name='schedule',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='pgjobs.schedule'),
        ),
        migrations.AddConstraint(
            model_name='job',
            constraint=models.UniqueConstraint(condition=models.Q(('schedule__isnull', False)), fields=('schedule', 'scheduled_at'), name='pgjobs_job_schedule_tick'),
        ),
        migrations.AddConstraint(
            model_name='job',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('schedule__isnull', True), ('scheduled_at__isnull', True)), models.Q(('schedule__isnull', False), ('scheduled_at__isnull', False)), _connector='OR'), name='pgjobs_job_tick_pair'),
        ),
    ]
