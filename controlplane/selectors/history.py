"""What happened, as the REST API lists it: decisions, transitions (with their steps) and events, newest
first, each list narrowed by the filters its query string parsed (`api/params.py`)."""

from __future__ import annotations

from datetime import datetime
from typing import TypeVar

from django.db.models import Model, QuerySet

from controlplane.models import Decision, Event, Transition

JobRef = int | str | None  # a job id, a job name, or no filter

M = TypeVar("M", bound=Model)


def _of_job(qs: QuerySet[M], job: JobRef) -> QuerySet[M]:
    if job is None:
        return qs
    return qs.filter(job_id=job) if isinstance(job, int) else qs.filter(job__name=job)


def decisions(*, job: JobRef = None) -> QuerySet[Decision]:
    return _of_job(Decision.objects.select_related("job"), job)


def transitions(*, job: JobRef = None) -> QuerySet[Transition]:
    return _of_job(Transition.objects.select_related("job").prefetch_related("steps"), job)


def unfinished_transition_ids() -> list[int]:
    """Transitions pending or running: the periodic re-plan resumes those whose executor died."""
    live = [Transition.Status.PENDING, Transition.Status.RUNNING]
    return list(Transition.objects.filter(status__in=live).values_list("id", flat=True))


def events(
    *,
    job: JobRef = None,
    kind: str | None = None,
    node: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> QuerySet[Event]:
    """`kind` may be a prefix ending in '.' ('node.' is every node event); `since` and `until` are inclusive."""
    qs = _of_job(Event.objects.select_related("job", "node"), job)
    if kind:
        qs = qs.filter(kind__startswith=kind) if kind.endswith(".") else qs.filter(kind=kind)
    if node:
        qs = qs.filter(node__name=node)
    if since:
        qs = qs.filter(created__gte=since)
    if until:
        qs = qs.filter(created__lte=until)
    return qs
