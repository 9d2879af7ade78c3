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
