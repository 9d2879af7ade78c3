"""The invariant check (docs/design.md §3) that every write use case runs over the rows it changed."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from django.db import transaction

from controlplane.core.invariants import check_invariants
from controlplane.models import WorkerGPU
from controlplane.selectors.cluster import training_flags, worker_views
from controlplane.services.errors import InvariantViolation


@dataclass(slots=True)
class _Pending:
    """What the write use cases inside a `checked_once` block asked to check."""

    job_ids: set[int] = field(default_factory=set)
    gpu_ids: set[int] = field(default_factory=set)


_pending: ContextVar[_Pending | None] = ContextVar("pearl_invariants_pending", default=None)


def assert_invariants(*, job_ids: Iterable[int] = (), gpu_ids: Iterable[int] = ()) -> None:
    """Check docs/design.md §3 over every alive worker touching these jobs or GPUs; raise 409 if violated. Inside a
    `checked_once` block the check is left to the block's end (still before its transaction commits)."""
    pending = _pending.get()
    if pending is not None:
        pending.job_ids.update(job_ids)
        pending.gpu_ids.update(gpu_ids)
        return
    _check(list(job_ids), set(gpu_ids))


def _check(job_ids: list[int], gpu_ids: set[int]) -> None:
    # Other jobs' workers on the same GPUs count too: widen to every GPU the jobs hold.
    gpu_ids = gpu_ids | set(
        WorkerGPU.objects.filter(alive=True, worker__job_id__in=job_ids).values_list("gpu_id", flat=True)
    )
    views = worker_views(job_ids=job_ids, gpu_ids=gpu_ids)
    problems = check_invariants(views, training_flags({v.job for v in views} | set(job_ids)))
    if problems:
        raise InvariantViolation("; ".join(problems))


@contextmanager
def checked_once() -> Iterator[None]:
    """The write use cases called inside check the invariants once, together, over everything they touched,
    when the block ends: a batch of service calls (an executor pass) reads the job's workers once instead of
    once per call. The block must run inside a transaction, so the check still comes before anything commits
    and a violation rolls the whole batch back. A block nested in another checks on its own (`take_out`
    needs to know whether its own change is valid); a block left by an exception checks nothing."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("checked_once() runs inside a transaction (transaction.atomic)")
    pending = _Pending()
    token = _pending.set(pending)
    try:
        yield
    finally:
        _pending.reset(token)
    if pending.job_ids or pending.gpu_ids:
        _check(sorted(pending.job_ids), pending.gpu_ids)
