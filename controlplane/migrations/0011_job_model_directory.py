from django.db import migrations, models


class Migration(migrations.Migration):
    """Job.model may name a model directory by its absolute path (issue 36): up to 512 characters."""

    dependencies = [
        ("controlplane", "0010_trajectory_rerun_resumed"),
    ]

    operations = [
        migrations.AlterField(
            model_name="job",
            name="model",
            field=models.CharField(default="tiny", max_length=512),
        ),
    ]
