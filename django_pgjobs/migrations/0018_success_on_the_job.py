from django.db import migrations, models

# An attempt that succeeds writes no attempt row (sql/jobs.sql, settle_jobs): its job keeps it,
# with its handler's time in this column. Nullable with no default: adding it rewrites nothing.


class Migration(migrations.Migration):

    dependencies = [
        ("pgjobs", "0017_hand_over_plan"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="duration_ms",
            field=models.IntegerField(blank=True, null=True),
        ),
    ]
