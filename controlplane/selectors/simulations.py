"""Simulator comparisons as the API, the dashboard's deltas and the simulator page read them."""

from __future__ import annotations

from typing import Any

from controlplane.models import SimulationRun

LISTED = 50  # the newest comparisons the list shows


def run_dict(sim: SimulationRun, *, full: bool = True) -> dict[str, Any]:
    """One comparison; `full` adds its result (the list and the deltas leave it out: it is large)."""
    out = {
        "id": sim.pk,
        "scenario": sim.scenario,
        "seed": sim.seed,
        "policies": sim.policies,
        "status": sim.status,
        "error": sim.error,
        "wall_s": sim.wall_s,
        "created": sim.created.isoformat(),
        "finished": sim.finished.isoformat() if sim.finished else None,
        "created_by": sim.created_by.username if sim.created_by_id and sim.created_by else None,
    }
    if full:
        out["result"] = sim.result
    return out


def simulation_runs(limit: int = LISTED) -> list[dict[str, Any]]:
    """The newest comparisons first, without their results."""
    return [run_dict(r, full=False) for r in SimulationRun.objects.select_related("created_by")[:limit]]


def simulation_run(run_id: int) -> dict[str, Any] | None:
    """One comparison with its result, or None when there is no such run."""
    run = SimulationRun.objects.select_related("created_by").filter(pk=run_id).first()
    return None if run is None else run_dict(run)
