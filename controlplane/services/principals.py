"""Who speaks on a link, and what it may report about.

A principal is derived from the database on every message (never from what the message claims):
a node agent may speak for the workers bound to its node and report telemetry for their jobs. The
rollout driver (one per job) becomes another constructor here (its job, that job's workers), and
every intake check (`check_job`, `check_worker`) stays the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from controlplane.models import Job, Node, Worker
from controlplane.services.errors import NotOwned


@dataclass(frozen=True, slots=True)
class Principal:
    actor: str  # for events: "agent:<node>"
    node_id: int | None  # the node it speaks for, if any
    jobs: dict[str, int]  # job name -> id it may report for
    workers: frozenset[int]  # worker ids it may speak for

    def check_job(self, name: str, where: str) -> int:
        job_id = self.jobs.get(name)
        if job_id is None:
            raise NotOwned(f"{where}: {self.actor} runs no worker of job {name[:63]!r}", field="job")
        return job_id

    def check_worker(self, worker_id: int, where: str) -> None:
        if worker_id not in self.workers:
            raise NotOwned(f"{where}: worker {worker_id} is not one of {self.actor}'s", field="worker")


def node_principal(node: Node) -> Principal:
    """A node agent: its node's workers, alive or stopped within one lease (their last reports may still
    be on the way), and the jobs of those workers."""
    recent = timezone.now() - timedelta(seconds=settings.PEARL["LEASE_S"])
    rows = list(Worker.objects.filter(Q(alive=True) | Q(stopped_at__gte=recent), node=node).values_list("id", "job_id"))
    job_ids = {j for _, j in rows}
    names = dict(Job.objects.filter(id__in=job_ids).values_list("name", "id"))
    return Principal(actor=f"agent:{node.name}", node_id=node.pk, jobs=names, workers=frozenset(w for w, _ in rows))


def job_principal(job: Job) -> Principal:
    """A job's rollout driver: it reports for its one job and may name any of that job's workers."""
    workers = frozenset(Worker.objects.filter(job=job).values_list("id", flat=True))
    return Principal(actor=f"driver:{job.name}", node_id=None, jobs={job.name: job.pk}, workers=workers)
