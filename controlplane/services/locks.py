"""Row locks and the lock order every write use case follows.

Lock order. Every transaction that locks or writes more than one of these rows takes them in the order
job → node → worker (jobs by id, nodes by id): the hierarchy of the state model (a job's workers sit on
nodes; a worker's GPUs are its node's). A transaction that took a worker row and then waited for its
node, while a heartbeat held the node and waited for the worker, was a deadlock that PostgreSQL broke by
aborting one of them: a lost heartbeat or a stopped executor. `lock_nodes` is how a use case that
changes workers takes their nodes first. What is left (a cycle through rows outside this order) is
retried by the entry points (`services.retry.retry_transient`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from django.db.models import Model, QuerySet

from controlplane.models import Job, Node
from controlplane.services.errors import Conflict, NotFound

M = TypeVar("M", bound=Model)


def locked(qs: QuerySet[M]) -> QuerySet[M]:
    """SELECT ... FOR NO KEY UPDATE OF the queryset's own rows on PostgreSQL. Rows joined by select_related
    stay unlocked: each use case takes them itself, in the lock order. NO KEY: no use case changes a key,
    and a row inserted elsewhere that refers to a locked one (an event of a locked job, a telemetry sample
    of a locked node) takes only a key-share lock, which this one does not block; FOR UPDATE would make
    every such insert a hidden lock on the job or node, out of the lock order. SQLite serialises writers
    with IMMEDIATE transactions."""
    return qs.select_for_update(of=("self",), no_key=True)


def lock_job(job_id: int, *, field: str = "id", live: str = "") -> Job:
    """The job row, locked for this transaction. 404 if it does not exist; with `live` (what the caller
    is about to do), 409 if the job already ended."""
    job = locked(Job.objects.filter(pk=job_id)).first()
    if job is None:
        raise NotFound(f"job {job_id} does not exist", field=field)
    if live and job.status in (Job.Status.STOPPED, Job.Status.FAILED):
        raise Conflict(f"job {job.name} is already {job.status}; {live}", field="status")
    return job


def lock_nodes(node_ids: Iterable[int]) -> dict[int, Node]:
    """These nodes' rows, locked in id order (the lock order above), by id."""
    ids = sorted({int(i) for i in node_ids})
    return {n.pk: n for n in locked(Node.objects.filter(pk__in=ids)).order_by("pk")} if ids else {}
