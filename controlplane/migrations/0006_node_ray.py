from django.db import migrations, models


class Migration(migrations.Migration):
    """Issue 21: a node's Ray id and address (the Ray bridge), and bridge-scoped credentials."""

    dependencies = [
        ('controlplane', '0005_returned_at_training_begin'),
    ]

    operations = [
        migrations.AddField(
            model_name='node',
            name='ray_node_id',
            field=models.CharField(blank=True, db_index=True, max_length=64),
        ),
        migrations.AddField(
            model_name='node',
            name='ray_address',
            field=models.CharField(blank=True, max_length=64),
        ),
        migrations.AddField(
            model_name='agentcredential',
            name='scope',
            field=models.CharField(default='node', max_length=8),
        ),
    ]
