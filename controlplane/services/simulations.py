"""Simulator comparisons asked for from the dashboard: recorded, run by a Celery worker, kept as JSON.

The summary is exactly `python -m controlplane.sim compare --json` (`compare_json`); the charts add, per
policy, the throughput per step, the GPU–role timeline, the borrowed windows and each step's configuration
and predicted vs simulated makespan (the decisions the policy made, step by step)."""

from __future__ import annotations

import time
from typing import Any

from django.db import transaction
from django.utils import timezone

from controlplane.models import SimulationRun
from controlplane.selectors.simulations import run_dict
from controlplane.services import dispatch
from controlplane.services.errors import Conflict, InvalidInput, NotFound
from controlplane.services.events import push_delta_on_commit
from controlplane.services.locks import locked

MAX_TIMELINE_POINTS = 2000


def scenarios() -> list[dict[str, Any]]:
    from controlplane.sim.scenario import get_scenario, list_scenarios

    out = []
    for name in list_scenarios():
        sc = get_scenario(name)
        out.append(
            {
                "name": name,
                "description": sc.description,
                "policies": list(sc.policies),
                "seed": sc.seed,
                "duration_s": sc.duration_s,
            }
        )
    return out


def request_run(*, scenario: str, seed: int | None, policies: list[str], user: Any = None) -> SimulationRun:
    """Validate and record a comparison; a Celery worker runs it after commit."""
    from controlplane.sim.scenario import get_scenario, list_scenarios

    known = list_scenarios()
    if scenario not in known:  # only shipped names: never a path
        raise InvalidInput(f"unknown scenario {scenario[:80]!r}; known: {', '.join(known)}", field="scenario")
    sc = get_scenario(scenario)
    unknown = sorted(set(policies) - set(sc.policies))
    if unknown:
        raise InvalidInput(
            f"policies {unknown} are not in scenario {scenario} (it has {list(sc.policies)})", field="policies"
        )
    with transaction.atomic():
        if (
            SimulationRun.objects.filter(
                status__in=[SimulationRun.Status.PENDING, SimulationRun.Status.RUNNING]
            ).count()
            >= 4
        ):
            raise Conflict("four simulations are already queued or running; wait for one to finish", field="scenario")
        run = SimulationRun.objects.create(
            scenario=scenario,
            seed=sc.seed if seed is None else seed,
            policies=policies,
            created_by=user if getattr(user, "is_authenticated", False) else None,
        )
        dispatch.run_simulation_on_commit(run.pk)
        _push(run)
    return run


def run(*, run_id: int) -> SimulationRun:
    """Run a recorded comparison (idempotent: a finished run is returned as it is)."""
    from controlplane.sim.cli import compare, compare_json
    from controlplane.sim.scenario import get_scenario

    with transaction.atomic():
        sim = locked(SimulationRun.objects.filter(pk=run_id)).first()
        if sim is None:
            raise NotFound(f"simulation {run_id} does not exist")
        if sim.status in (SimulationRun.Status.SUCCEEDED, SimulationRun.Status.FAILED):
            return sim
        sim.status = SimulationRun.Status.RUNNING
        sim.save(update_fields=["status"])
        _push(sim)
    t0 = time.perf_counter()
    try:
        sc = get_scenario(sim.scenario).with_seed(sim.seed)
        results = compare(sc, sim.policies or None, record_timeline=True)
        sim.result = compare_json(sc, results) | {"series": {p: _series(r, sc.cluster.tp) for p, r in results.items()}}
        sim.status = SimulationRun.Status.SUCCEEDED
    except Exception as exc:  # the run is data: record why it failed, the page shows it
        sim.status, sim.error = SimulationRun.Status.FAILED, f"{type(exc).__name__}: {exc}"[:2000]
    sim.wall_s = round(time.perf_counter() - t0, 3)
    sim.finished = timezone.now()
    with transaction.atomic():
        sim.save(update_fields=["status", "result", "error", "wall_s", "finished"])
        _push(sim)
    return sim


def _series(r: Any, tp: int) -> dict[str, Any]:
    from controlplane.sim.report import per_step_throughput

    timeline = r.timeline
    if len(timeline) > MAX_TIMELINE_POINTS:  # keep the page light: every n-th change plus the last
        stride = len(timeline) // MAX_TIMELINE_POINTS + 1
        timeline = [*timeline[::stride], timeline[-1]]
    return {
        "throughput": [[s, round(v, 3)] for s, v in per_step_throughput(r)],
        "steps": [
            {
                "step": s.step,
                "start_s": round(s.start_s, 3),
                "makespan_s": round(s.makespan_s, 3),
                "predicted_makespan_s": s.predicted_makespan_s,
                "configuration": s.config_label,
            }
            for s in r.step_stats
        ],
        "timeline": [
            {k: row[k] for k in ("t", "why", "prefill", "decode", "colocated", "borrowed", "transitioning")}
            | {"available_workers": row["available_gpus"] / tp}
            for row in timeline
        ],
        "borrow_windows": [[round(a, 3), round(b, 3), sid] for a, b, sid in r.borrow_windows],
    }


def _push(sim: SimulationRun) -> None:
    push_delta_on_commit(kind="simulation", key=str(sim.pk), data=run_dict(sim, full=False))
