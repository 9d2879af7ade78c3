"""Thin Celery wrappers over services. Tasks take ids, never objects; all are idempotent (acks_late).

The services send these tasks by name (`services.dispatch.TaskName`), never by importing this module:
the tasks are adapters on top of the services."""

from __future__ import annotations

import time

from celery import shared_task

from controlplane.selectors.history import unfinished_transition_ids
from controlplane.selectors.jobs import live_job_ids
from controlplane.services import (
    arbitration,
    checkpoints,
    dispatch,
    draining,
    executor,
    expiry,
    planner,
    simulations,
    telemetry,
    tracking,
)
from controlplane.services.dispatch import TaskName
from controlplane.services.plan_queue import take_arbitration_reasons, take_plan_signals
from controlplane.services.retry import retry_transient


@shared_task(name=TaskName.SWEEP)
def sweep() -> dict[str, list[str] | int]:
    """Heartbeat sweeper: expire leases (fence before reassignment), remove preempted nodes, prune telemetry,
    and send the dashboards every node's last-seen (their heartbeat ages; heartbeats push none)."""
    expired = expiry.expire_leases()
    gone = draining.remove_preempted()
    pruned = telemetry.prune_if_due()
    seen = expiry.push_last_seen()
    return {"expired": expired, "gone": gone, "pruned": pruned, "seen": seen}


@shared_task(name=TaskName.ECHO)
def echo(payload: dict) -> dict:
    """Round-trip probe used by health checks and tests (proves JSON serialisation through the broker)."""
    return {"echo": payload}


@shared_task(name=TaskName.PLAN_JOB)
def plan_job(job_id: int, signal: str | None = None) -> list[int]:
    """① budget → ② decide → ③ plan for one job, once per batch of queued signals (single flight);
    each transition is executed by `execute_transition`."""
    planned: list[int] = []
    while (sig := take_plan_signals(job_id) or signal) is not None:
        signal = None  # a queued signal comes first; the one given is planned once at most
        t = planner.plan_job_isolated(job_id=job_id, signal=sig)
        if t is not None:
            planned.append(t.pk)
    return planned


@shared_task(name=TaskName.ARBITRATE)
def arbitrate() -> list[int]:
    """One division of the cluster (core.arbiter) per batch of queued cluster events (single flight), then,
    in this one task, a plan for each job whose allotment changed, the shrinking ones first: the jobs never
    race each other for units. Each job's plan is its own PEARL decision inside its allotment."""
    planned: list[int] = []
    while (reason := take_arbitration_reasons()) is not None:
        division = retry_transient(arbitration.rebalance, reason=reason)
        for job_id, signal in division.plan_order:
            t = planner.plan_job_isolated(job_id=job_id, signal=signal)
            if t is not None:
                planned.append(t.pk)
    return planned


# While a transition waits for its agents, its task advances it again as soon as one of them reports
# a change to the job's workers (or every POLL_S), for HOLD_S, then hands over to a fresh task so the
# worker's threads are not held by one long wait.
POLL_S = 0.25
HOLD_S = 2.0


@shared_task(name=TaskName.EXECUTE_TRANSITION)
def execute_transition(transition_id: int, owner: str = "") -> str:
    """Advance the transition; while it waits for the agents, look again when they report, keeping the
    lease (state and lease live in the database: a killed worker's transition is resumed by
    `replan_all` once its lease runs out, never run twice at once)."""
    until = time.monotonic() + HOLD_S
    while True:
        tr, outcome = retry_transient(executor.advance, transition_id=transition_id, owner=owner)
        if outcome != "waiting":
            return outcome
        owner = tr.lease_owner
        if time.monotonic() >= until:
            dispatch.execute_transition(transition_id, owner, countdown=0)
            return outcome
        dispatch.wait_for_report(tr.job_id, POLL_S)


@shared_task(name=TaskName.REPLAN_ALL)
def replan_all() -> list[int]:
    """Periodic re-plan of every live job; resumes transitions whose executor died (its lease ran out)."""
    for tr_id in unfinished_transition_ids():
        tr, outcome = retry_transient(executor.advance, transition_id=tr_id)
        if outcome == "waiting":  # its executor died (the lease ran out): this one carries on
            dispatch.execute_transition(tr_id, tr.lease_owner, countdown=0.25)
    # the division follows the jobs' refitted predictors (hysteresis: no flapping); run here, not queued, so the
    # periodic re-plan also heals an arbiter task whose send was lost
    retry_transient(arbitration.rebalance, reason="periodic")
    planned = []
    for job_id in live_job_ids():
        t = planner.plan_job_isolated(job_id=job_id, signal="periodic")  # one failing job never stops the others
        if t is not None:
            planned.append(t.pk)
    return planned


@shared_task(name=TaskName.RUN_SIMULATION)
def run_simulation(run_id: int) -> str:
    """A simulator comparison asked for from the dashboard (seconds to a minute of CPU)."""
    return simulations.run(run_id=run_id).status


@shared_task(name=TaskName.TRAINED_STEP)
def trained_step(job_id: int) -> dict:
    """After a trainer update of the job (issue 36): record the checkpoints its directory holds now, then log
    the trained steps its experiment trackers have not taken (a tracker's failure is reported, never raised)."""
    found = checkpoints.sync(job_id)
    return {"checkpoints": [c.step for c in found], "tracking": tracking.sync(job_id)}
