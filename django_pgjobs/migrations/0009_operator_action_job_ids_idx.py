import django.contrib.postgres.indexes
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('pgjobs', '0008_job_claimed_at'),
    ]

    # A job page's operator history looks its actions up by job id (job_ids @> '[id]'): without
    # this index that reads the whole audit table.
    operations = [
        migrations.AddIndex(
            model_name='operatoraction',
            index=django.contrib.postgres.indexes.GinIndex(
                fields=['job_ids'], name='pgjobs_action_job_ids_idx', opclasses=['jsonb_path_ops'],
            ),
        ),
    ]
