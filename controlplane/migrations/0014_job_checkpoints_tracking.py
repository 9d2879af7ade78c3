"""Issue 36: exported checkpoints (the Checkpoint rows; a job's checkpoint_every / checkpoint_keep /
checkpoint_dir / init_from) and experiment trackers (a job's tracking and tracking_state)."""

import django.core.validators
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("controlplane", "0013_job_priority_weight_guarantee"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="checkpoint_every",
            field=models.PositiveIntegerField(default=10, validators=[django.core.validators.MinValueValidator(1)]),
        ),
        migrations.AddField(
            model_name="job",
            name="checkpoint_keep",
            field=models.PositiveIntegerField(default=3),
        ),
        migrations.AddField(
            model_name="job",
            name="checkpoint_dir",
            field=models.CharField(blank=True, max_length=1024),
        ),
        migrations.AddField(
            model_name="job",
            name="init_from",
            field=models.CharField(blank=True, max_length=1024),
        ),
        migrations.AddField(
            model_name="job",
            name="tracking",
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AddField(
            model_name="job",
            name="tracking_state",
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.CreateModel(
            name="Checkpoint",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("step", models.PositiveIntegerField()),
                ("weight_version", models.PositiveIntegerField()),
                ("written", models.DateTimeField()),
                ("size_bytes", models.PositiveBigIntegerField(default=0)),
                ("path", models.CharField(max_length=1100)),
                ("files", models.JSONField(blank=True, default=dict)),
                ("tokenizer", models.CharField(blank=True, max_length=16)),
                ("created", models.DateTimeField(auto_now_add=True)),
                (
                    "job",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="checkpoints",
                        to="controlplane.job",
                    ),
                ),
            ],
            options={
                "ordering": ["job_id", "step"],
                "constraints": [models.UniqueConstraint(fields=("job", "step"), name="checkpoint_job_step")],
            },
        ),
    ]
