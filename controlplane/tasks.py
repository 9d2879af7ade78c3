"""Thin Celery wrappers over services. Tasks take ids, never objects; all are idempotent (acks_late)."""
from __future__ import annotations

from celery import shared_task

from controlplane.services import nodes, telemetry


@shared_task(name="controlplane.sweep")
def sweep() -> dict[str, list[str] | int]:
    """Heartbeat sweeper: expire leases (fence before reassignment), remove preempted nodes, prune telemetry."""
    expired = nodes.expire_leases()
    gone = nodes.remove_preempted()
    pruned = telemetry.prune()
    return {"expired": expired, "gone": gone, "pruned": pruned}


@shared_task(name="controlplane.echo")
def echo(payload: dict) -> dict:
    """Round-trip probe used by health checks and tests (proves JSON serialisation through the broker)."""
    return {"echo": payload}


@shared_task(name="controlplane.plan_job")
def plan_job(job_id: int, signal: str = "periodic") -> int | None:
    """① budget → ② decide → ③ plan for one job; the transition is executed by `execute_transition`."""
    from controlplane.services import planner

    transition = planner.plan_job(job_id=job_id, signal=signal)
    return transition.pk if transition else None


@shared_task(name="controlplane.execute_transition")
def execute_transition(transition_id: int) -> str:
    from controlplane.services import executor

    return executor.execute_transition(transition_id=transition_id).status


@shared_task(name="controlplane.replan_all")
def replan_all() -> list[int]:
    """Periodic re-plan of every live job (also resumes transitions a killed executor left running)."""
    from controlplane.models import Job, Transition
    from controlplane.services import executor, planner

    for tr_id in Transition.objects.filter(status__in=[Transition.Status.PENDING, Transition.Status.RUNNING]).values_list("id", flat=True):
        executor.execute_transition(transition_id=tr_id)
    planned = []
    for job_id in Job.objects.filter(status__in=[Job.Status.PENDING, Job.Status.RUNNING]).values_list("id", flat=True):
        t = planner.plan_job(job_id=job_id)
        if t is not None:
            planned.append(t.pk)
    return planned


@shared_task(name="controlplane.run_simulation")
def run_simulation(run_id: int) -> str:
    """A simulator comparison asked for from the dashboard (seconds to a minute of CPU)."""
    from controlplane.services import simulations

    return simulations.run(run_id=run_id).status
