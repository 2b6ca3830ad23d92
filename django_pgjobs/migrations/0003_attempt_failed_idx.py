from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('pgjobs', '0002_operator_action'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='attempt',
            index=models.Index(condition=models.Q(('failure_class', ''), _negated=True), fields=['claimed_at'], name='pgjobs_attempt_failed_idx'),
        ),
    ]
