from django.db import migrations, models


class Migration(migrations.Migration):
    """Issue 19: a done trajectory trained on (true) or left out of its step's update (false); else null."""

    dependencies = [
        ("controlplane", "0008_job_hardware_types"),
    ]

    operations = [
        migrations.AddField(
            model_name="trajectory",
            name="trained",
            field=models.BooleanField(blank=True, null=True),
        ),
    ]
