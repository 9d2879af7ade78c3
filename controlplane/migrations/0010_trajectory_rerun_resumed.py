from django.db import migrations, models


class Migration(migrations.Migration):
    """Issue 34: a trajectory record says whether it was regenerated after a crash (rerun) or continued from a
    kept prefix (resumed); `trained` is true only once the update that consumed it committed."""

    dependencies = [
        ("controlplane", "0009_trajectory_trained"),
    ]

    operations = [
        migrations.AddField(
            model_name="trajectory",
            name="rerun",
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name="trajectory",
            name="resumed",
            field=models.BooleanField(default=False),
        ),
    ]
