"""Define every periodic task in one idempotent place (django-celery-beat's database schedule)."""

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from controlplane.services.dispatch import TaskName

PERIODIC = [
    # (name, task, seconds)
    ("heartbeat sweeper", TaskName.SWEEP, lambda: settings.PEARL["SWEEP_S"]),
    ("re-plan running jobs", TaskName.REPLAN_ALL, lambda: settings.PEARL["REPLAN_S"]),
]


class Command(BaseCommand):
    help = "Create or update the periodic tasks (sweeper, periodic re-plan)."

    def handle(self, *args: Any, **opts: Any) -> None:
        for name, task, seconds in PERIODIC:
            every = max(1, int(round(seconds())))
            schedule, _ = IntervalSchedule.objects.get_or_create(every=every, period=IntervalSchedule.SECONDS)
            # a run that could not start within its own period is dropped, not queued behind the next one
            PeriodicTask.objects.update_or_create(
                name=name, defaults={"task": task, "interval": schedule, "enabled": True, "expire_seconds": every}
            )
            self.stdout.write(f"{name}: {task} every {every}s")
