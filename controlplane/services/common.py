"""Helpers every write use case shares: row locks and the invariant check."""
from __future__ import annotations

from typing import Iterable, TypeVar

from django.db import transaction
from django.db.models import Model, QuerySet

from controlplane.core.invariants import check_invariants
from controlplane.models import Job, WorkerGPU
from controlplane.selectors.cluster import training_flags, worker_views
from controlplane.services.errors import Conflict, InvariantViolation, NotFound

M = TypeVar("M", bound=Model)


def locked(qs: QuerySet[M]) -> QuerySet[M]:
    """SELECT ... FOR UPDATE on PostgreSQL (SQLite serialises writers with IMMEDIATE transactions)."""
    return qs.select_for_update()


def lock_job(job_id: int, *, field: str = "id", live: str = "") -> Job:
    """The job row, locked for this transaction. 404 if it does not exist; with `live` (what the caller
    is about to do), 409 if the job already ended."""
    job = locked(Job.objects.filter(pk=job_id)).first()
    if job is None:
        raise NotFound(f"job {job_id} does not exist", field=field)
    if live and job.status in (Job.Status.STOPPED, Job.Status.FAILED):
        raise Conflict(f"job {job.name} is already {job.status}; {live}", field="status")
    return job


def assert_invariants(*, job_ids: Iterable[int] = (), gpu_ids: Iterable[int] = ()) -> None:
    """Check DESIGN §4 over every alive worker touching these jobs or GPUs; raise 409 if violated."""
    job_ids = list(job_ids)
    # Other jobs' workers on the same GPUs count too: widen to every GPU the jobs hold.
    gpu_ids = set(gpu_ids) | set(WorkerGPU.objects.filter(alive=True, worker__job_id__in=job_ids).values_list("gpu_id", flat=True))
    views = worker_views(job_ids=job_ids, gpu_ids=gpu_ids)
    problems = check_invariants(views, training_flags({v.job for v in views} | set(job_ids)))
    if problems:
        raise InvariantViolation("; ".join(problems))


def enqueue_plan(job_id: int, signal: str) -> None:
    """Ask a Celery worker to re-plan the job once this transaction commits (ids, never objects)."""
    from controlplane import tasks

    transaction.on_commit(lambda: tasks.plan_job.delay(job_id, signal), robust=True)
