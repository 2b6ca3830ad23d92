from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('pgjobs', '0007_traceparent'),
    ]

    # Nullable with no default: PostgreSQL adds the column without rewriting the table. Jobs
    # claimed before it have a running attempt row instead; settle completes either kind.
    operations = [
        migrations.AddField(
            model_name='job',
            name='claimed_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
