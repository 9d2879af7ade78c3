"""A job's agent trajectories, as the API and the job page read them."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Q, QuerySet

from controlplane.models import TelemetrySample, Trajectory

SUMMARY_FIELDS = (
    "id",
    "step",
    "name",
    "status",
    "reward",
    "turns",
    "forks",
    "reason",
    "token_count",
    "truncated",
    "trained",
    "rerun",
    "resumed",
)


def trajectories(job_id: int, step: int | None = None, status: str | None = None) -> QuerySet[Trajectory]:
    qs = Trajectory.objects.filter(job_id=job_id)
    if step is not None:
        qs = qs.filter(step=step)
    if status:
        qs = qs.filter(status=status)
    return qs.order_by("step", "name")


def steps(job_id: int) -> list[dict[str, Any]]:
    """The steps with trajectories, newest first, with counts per status, and from the step's STEP record
    (once it is collected) the members given up (failed `agent_max_attempts` times: out of the batch) and
    the groups dropped (left with fewer than 2 members): slots of the batch that were not trained. The audit
    counts (issue 34): `trained` (consumed by the step's committed update), `untrained` (done, left out of
    it: their rows say why), `rerun` (regenerated after a crash), `resumed` (continued from a kept prefix)."""
    out: dict[int, dict[str, Any]] = {}
    rows = Trajectory.objects.filter(job_id=job_id).values("step", "status").annotate(n=Count("id")).order_by("-step")
    for r in rows:
        entry = out.setdefault(
            r["step"],
            {
                "step": r["step"],
                "total": 0,
                "given_up": 0,
                "dropped_groups": 0,
                "trained": 0,
                "untrained": 0,
                "rerun": 0,
                "resumed": 0,
            },
        )
        entry[r["status"]] = r["n"]
        entry["total"] += r["n"]
    audit = (
        Trajectory.objects.filter(job_id=job_id)
        .values("step")
        .annotate(  # (an annotation may not take a field's name)
            n_trained=Count("id", filter=Q(trained=True)),
            n_untrained=Count("id", filter=Q(trained=False)),
            n_rerun=Count("id", filter=Q(rerun=True)),
            n_resumed=Count("id", filter=Q(resumed=True)),
        )
    )
    for a in audit:
        if a["step"] in out:
            row = out[a["step"]]
            row["trained"], row["untrained"] = a["n_trained"], a["n_untrained"]
            row["rerun"], row["resumed"] = a["n_rerun"], a["n_resumed"]
    if out:
        which = Q(record__step__in=list(out))
        if 0 in out:  # a record leaves its fields at their defaults out: step 0's has no "step"
            which |= ~Q(record__has_key="step")
        records = TelemetrySample.objects.filter(which, job_id=job_id, kind="step").values_list("record", flat=True)
        for rec in records:
            found = out.get(int(rec.get("step", 0)))
            if found is not None:  # the history keeps one record per step
                found["given_up"] = int(rec.get("given_up", 0))
                found["dropped_groups"] = int(rec.get("dropped_groups", 0))
    return list(out.values())
