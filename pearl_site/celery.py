"""The Celery app: JSON only, configured from Django settings (CELERY_* names)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pearl_site.settings")

app = Celery("pearl")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
