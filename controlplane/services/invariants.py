"""The invariant check (DESIGN §4) that every write use case runs over the rows it changed."""

from __future__ import annotations

from collections.abc import Iterable

from controlplane.core.invariants import check_invariants
from controlplane.models import WorkerGPU
from controlplane.selectors.cluster import training_flags, worker_views
from controlplane.services.errors import InvariantViolation


def assert_invariants(*, job_ids: Iterable[int] = (), gpu_ids: Iterable[int] = ()) -> None:
    """Check DESIGN §4 over every alive worker touching these jobs or GPUs; raise 409 if violated."""
    job_ids = list(job_ids)
    # Other jobs' workers on the same GPUs count too: widen to every GPU the jobs hold.
    gpu_ids = set(gpu_ids) | set(
        WorkerGPU.objects.filter(alive=True, worker__job_id__in=job_ids).values_list("gpu_id", flat=True)
    )
    views = worker_views(job_ids=job_ids, gpu_ids=gpu_ids)
    problems = check_invariants(views, training_flags({v.job for v in views} | set(job_ids)))
    if problems:
        raise InvariantViolation("; ".join(problems))
