import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    """Issue 19: a job's agent spec (environment "agent") and the trajectories its driver reports."""

    dependencies = [
        ('controlplane', '0006_node_ray'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='agent',
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.CreateModel(
            name='Trajectory',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('step', models.PositiveIntegerField()),
                ('name', models.CharField(max_length=128)),
                ('status', models.CharField(choices=[('running', 'Running'), ('done', 'Done'), ('failed', 'Failed'),
                                                     ('aborted', 'Aborted')], max_length=16)),
                ('reward', models.FloatField(blank=True, null=True)),
                ('turns', models.PositiveIntegerField(default=0)),
                ('forks', models.PositiveIntegerField(default=0)),
                ('reason', models.TextField(blank=True)),
                ('stderr', models.TextField(blank=True)),
                ('messages', models.JSONField(blank=True, default=list)),
                ('tokens', models.JSONField(blank=True, default=list)),
                ('mask', models.JSONField(blank=True, default=list)),
                ('logprobs', models.JSONField(blank=True, default=list)),
                ('sample_lens', models.JSONField(blank=True, default=list)),
                ('token_count', models.PositiveIntegerField(default=0)),
                ('truncated', models.BooleanField(default=False)),
                ('weight_versions', models.JSONField(blank=True, default=list)),
                ('workers', models.JSONField(blank=True, default=list)),
                ('latency_s', models.JSONField(blank=True, default=list)),
                ('created', models.DateTimeField(auto_now_add=True)),
                ('job', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='trajectories',
                                          to='controlplane.job')),
            ],
            options={
                'ordering': ['step', 'name'],
                'indexes': [models.Index(fields=['job', 'step'], name='trajectory_job_step')],
                'constraints': [
                    models.UniqueConstraint(fields=('job', 'step', 'name'), name='trajectory_job_step_name'),
                ],
            },
        ),
    ]
