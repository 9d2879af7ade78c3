"""A job's agent trajectories, as the API and the job page read them."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, QuerySet

from controlplane.models import Trajectory

SUMMARY_FIELDS = ("id", "step", "name", "status", "reward", "turns", "forks", "reason", "token_count", "truncated")


def trajectories(job_id: int, step: int | None = None, status: str | None = None) -> QuerySet[Trajectory]:
    qs = Trajectory.objects.filter(job_id=job_id)
    if step is not None:
        qs = qs.filter(step=step)
    if status:
        qs = qs.filter(status=status)
    return qs.order_by("step", "name")


def steps(job_id: int) -> list[dict[str, Any]]:
    """The steps with trajectories, newest first, with counts per status."""
    out: dict[int, dict[str, Any]] = {}
    rows = Trajectory.objects.filter(job_id=job_id).values("step", "status").annotate(n=Count("id")).order_by("-step")
    for r in rows:
        entry = out.setdefault(r["step"], {"step": r["step"], "total": 0})
        entry[r["status"]] = r["n"]
        entry["total"] += r["n"]
    return list(out.values())
