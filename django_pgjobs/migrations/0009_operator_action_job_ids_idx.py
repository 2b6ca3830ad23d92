from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('pgjobs', '0008_job_claimed_at'),
    ]

    # A job page's operator history looks its actions up by job id (job_ids @> '[id]'): without
    # this index that reads the whole audit table. Written as SQL, not as a GinIndex in the
    # model's Meta: that class needs django.contrib.postgres in INSTALLED_APPS (Django 6 checks
    # it), which a project using this app should not have to add.
    operations = [
        migrations.RunSQL(
            'CREATE INDEX "pgjobs_action_job_ids_idx" ON "pgjobs_operator_action" '
            'USING gin ("job_ids" jsonb_path_ops)',
            reverse_sql='DROP INDEX "pgjobs_action_job_ids_idx"',
        ),
    ]
