"""Telemetry intake: validate every record against the core schema and against what the sender owns,
then store it for the tracker."""

from __future__ import annotations

from django.db import transaction

from controlplane.core.agent_link import TelemetryBatch
from controlplane.core.driver_link import TelemetryReport
from controlplane.core.telemetry import RecordKind, TelemetryRecord
from controlplane.models import Job, TelemetrySample
from controlplane.services import dispatch, latency
from controlplane.services.errors import InvalidInput
from controlplane.services.events import push_delta_on_commit
from controlplane.services.principals import Principal

RETAIN_PER_JOB = 20_000  # per job and kind
PRUNE_EVERY_S = 30.0  # the sweep runs every second; pruning that often would be most of its work
# One record per rollout or training step: the job page's history. Never pruned (a few per minute),
# unlike the engine records (turns, iterations, prefills) that arrive by the thousand.
HISTORY_KINDS = (RecordKind.STEP.value, RecordKind.TRAIN.value)


def _has_history(job_id: int, kind: str, step: int) -> bool:
    same = TelemetrySample.objects.filter(job_id=job_id, kind=kind)
    # the stored form omits fields at their default: step 0 has no "step" key
    return (same.filter(record__step=step) if step else same.exclude(record__has_key="step")).exists()


def ingest(*, principal: Principal, message: TelemetryBatch | TelemetryReport) -> int:
    """All-or-nothing: one bad record (malformed, or naming a job or worker the sender does not run)
    rejects the message and stores nothing, so no one feeds another job's predictor."""
    rows: list[TelemetrySample] = []
    turns: list[float] = []  # the turns' durations, for `latency.TURN_SECONDS` once stored
    history: set[tuple[int, str, int]] = set()
    for i, raw in enumerate(message.records):
        where = f"records[{i}]"
        try:
            r = TelemetryRecord.from_json(raw)
        except ValueError as exc:
            raise InvalidInput(f"{where}: {exc}", field="records") from None
        if not r.job:
            raise InvalidInput(f"{where}.job: every record names its job", field="records")
        job_id = principal.check_job(r.job, f"{where}.job")
        if r.worker is not None:
            principal.check_worker(r.worker, f"{where}.worker")
        if r.kind.value in HISTORY_KINDS:
            key = (job_id, r.kind.value, r.step)
            if key in history or _has_history(*key):
                continue  # a restarted driver may report a step again: the history keeps one record per step
            history.add(key)
        rows.append(TelemetrySample(job_id=job_id, node_id=principal.node_id, kind=r.kind, record=r.to_json()))
        if r.kind is RecordKind.TURN and r.duration_s > 0:
            turns.append(r.duration_s)
    with transaction.atomic():
        created = TelemetrySample.objects.bulk_create(rows)
        for row in created:  # the job page's charts grow by one point per step, live
            if row.kind in HISTORY_KINDS and row.job_id is not None:
                push_delta_on_commit(
                    kind="series", key=str(row.job_id), data={"job": row.job_id, "kind": row.kind, "record": row.record}
                )
        # a trainer update: its checkpoints and its experiment trackers are brought up to date off this path
        dispatch.trained_step_on_commit(r.job_id for r in created if r.kind == RecordKind.TRAIN and r.job_id)
    for seconds in turns:
        latency.TURN_SECONDS.observe(seconds)
    return len(rows)


def prune_if_due() -> int:
    """`prune` at most once per PRUNE_EVERY_S in this process (the sweep's share of it)."""
    from django.core.cache import cache

    return prune() if cache.add("pearl:telemetry-prune", 1, timeout=PRUNE_EVERY_S) else 0


def prune(*, keep: int = RETAIN_PER_JOB) -> int:
    """Drop the oldest engine records beyond `keep` per job and kind (called by the periodic sweep); the
    per-step history (HISTORY_KINDS) is kept whatever the flood of engine records. Each cut is one walk
    down the (job, kind, -id) index, not a scan and sort of the table."""
    removed = 0
    kinds = [k.value for k in RecordKind if k.value not in HISTORY_KINDS]
    for job_id in [*Job.objects.values_list("pk", flat=True), None]:
        for kind in kinds:
            of_job = (
                TelemetrySample.objects.filter(job__isnull=True)
                if job_id is None
                else TelemetrySample.objects.filter(job_id=job_id)
            )
            mine = of_job.filter(kind=kind)
            cutoff = mine.order_by("-id").values_list("id", flat=True)[keep : keep + 1]
            if cutoff:
                removed += mine.filter(id__lte=cutoff[0]).delete()[0]
    return removed
