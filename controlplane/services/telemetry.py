"""Telemetry intake: validate every record against the core schema, then store it for the tracker."""
from __future__ import annotations

from django.db import transaction

from controlplane.core.agent_link import Telemetry
from controlplane.core.telemetry import TelemetryRecord
from controlplane.models import Job, TelemetrySample
from controlplane.services.errors import InvalidInput

RETAIN_PER_JOB = 20_000


def ingest(*, node_id: int | None, message: Telemetry) -> int:
    """All-or-nothing: one bad record rejects the message and stores nothing."""
    records: list[TelemetryRecord] = []
    for i, raw in enumerate(message.records):
        try:
            records.append(TelemetryRecord.from_json(raw))
        except ValueError as exc:
            raise InvalidInput(f"records[{i}]: {exc}", field="records") from None
    names = {r.job for r in records if r.job}
    jobs = dict(Job.objects.filter(name__in=names).values_list("name", "id"))
    with transaction.atomic():
        TelemetrySample.objects.bulk_create(
            [TelemetrySample(job_id=jobs.get(r.job), node_id=node_id, kind=r.kind, record=r.to_json()) for r in records]
        )
    return len(records)


def prune(*, keep: int = RETAIN_PER_JOB) -> int:
    """Drop the oldest samples beyond `keep` per job (called by the periodic sweep)."""
    removed = 0
    for job_id in TelemetrySample.objects.values_list("job_id", flat=True).distinct():
        cutoff = TelemetrySample.objects.filter(job_id=job_id).order_by("-id").values_list("id", flat=True)[keep : keep + 1]
        if cutoff:
            removed += TelemetrySample.objects.filter(job_id=job_id, id__lte=cutoff[0]).delete()[0]
    return removed
