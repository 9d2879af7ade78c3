from django.db import migrations, models


class Migration(migrations.Migration):
    """Issue 23: the chip types a job's rollout pool accepts ([] = only its `hardware`)."""

    dependencies = [
        ("controlplane", "0007_job_agent"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="hardware_types",
            field=models.JSONField(blank=True, default=list),
        ),
    ]
