"""Agent trajectories as a job's rollout driver reports them (issue 19): kept per (job, step, name), the
latest report of a trajectory winning, and bounded per job (the oldest steps go first)."""

from __future__ import annotations

from collections.abc import Sequence

from controlplane.core import driver_link as dl
from controlplane.models import Job, Trajectory
from controlplane.services.errors import InvalidInput, NotFound

MAX_KEPT_PER_JOB = 20_000  # trajectory rows a job keeps; past it its oldest steps are deleted
FIELDS = (
    "status",
    "reward",
    "turns",
    "forks",
    "reason",
    "stderr",
    "messages",
    "tokens",
    "mask",
    "logprobs",
    "sample_lens",
    "token_count",
    "truncated",
    "weight_versions",
    "workers",
    "latency_s",
    "trained",
    "rerun",
    "resumed",
)


def record_trajectories(*, job_id: int, step: int, trajectories: Sequence[dl.TrajectorySummary]) -> int:
    """Store a report's trajectories (each already within the link's bounds); returns how many."""
    job = Job.objects.filter(pk=job_id).only("pk", "environment").first()
    if job is None:
        raise NotFound(f"job {job_id} does not exist")
    bad = next((t for t in trajectories if t.status not in dl.TRAJECTORY_STATUSES), None)
    if bad is not None:
        raise InvalidInput(
            f"status must be one of {list(dl.TRAJECTORY_STATUSES)}, got {bad.status[:16]!r}",
            field="trajectories.status",
        )
    bad = next((t for t in trajectories if not len(t.tokens) == len(t.mask) == len(t.logprobs)), None)
    if bad is not None:
        raise InvalidInput(
            f"trajectory {bad.name!r}: tokens, mask and logprobs differ in length", field="trajectories.mask"
        )
    latest = {t.name: t for t in trajectories}  # one row per name (a report naming one twice: the last)
    rows = [
        Trajectory(job_id=job.pk, step=step, name=t.name, **{f: getattr(t, f) for f in FIELDS}) for t in latest.values()
    ]
    Trajectory.objects.bulk_create(
        rows, update_conflicts=True, unique_fields=["job", "step", "name"], update_fields=list(FIELDS)
    )
    _trim(job.pk)
    return len(rows)


def mark_trained(*, job_id: int, report: dl.TrainedReport) -> int:
    """Step `report.step`'s update committed: its consumed trajectories' records say `trained: true`, those it
    left out `trained: false` with the reason (rows not reported yet are not made here: a record reported later
    carries its own `trained`). Returns the rows changed. Idempotent (a driver may send it again)."""
    if not Job.objects.filter(pk=job_id).exists():
        raise NotFound(f"job {job_id} does not exist")
    both = set(report.trained) & set(report.untrained)
    if both:
        raise InvalidInput(f"trajectory {sorted(both)[0]!r} is both trained and untrained", field="untrained")
    rows = Trajectory.objects.filter(job_id=job_id, step=report.step)
    n = rows.filter(name__in=report.trained).update(trained=True)
    if report.untrained:
        n += rows.filter(name__in=report.untrained).update(trained=False, reason=report.reason)
    return n


def _trim(job_id: int) -> None:
    """Past MAX_KEPT_PER_JOB rows, the steps older than the one the bound falls in are deleted."""
    cut = list(
        Trajectory.objects.filter(job_id=job_id)
        .order_by("-step", "-id")
        .values_list("step", flat=True)[MAX_KEPT_PER_JOB : MAX_KEPT_PER_JOB + 1]
    )
    if cut:
        Trajectory.objects.filter(job_id=job_id, step__lt=cut[0]).delete()
