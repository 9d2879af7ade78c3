"""Job read models for the dashboard."""
from __future__ import annotations

from typing import Any

from controlplane.models import Job


def jobs_overview(limit: int = 50) -> list[dict[str, Any]]:
    return list(
        Job.objects.order_by("-created").values(
            "id", "name", "status", "policy", "model", "engine", "mode", "n_prefill", "n_decode", "n_colocated", "step",
            "weight_version", "training_active",
        )[:limit]
    )


def recent_events(limit: int = 30) -> list[dict[str, Any]]:
    """Newest first, in the same shape as the `event` deltas."""
    from controlplane.models import Event

    rows = Event.objects.select_related("job", "node").order_by("-created", "-id")[:limit]
    return [
        {"id": e.id, "kind": e.kind, "message": e.message, "job": e.job.name if e.job else None,
         "node": e.node.name if e.node else None, "actor": e.actor, "created": e.created.isoformat(), "data": e.data}
        for e in rows
    ]
