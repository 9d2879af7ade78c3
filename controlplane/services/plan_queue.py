"""The plan queue: the signals that ask for a job's re-plan, kept in Redis per job, so that one plan task
at a time (single flight) plans once for every signal queued meanwhile; a job with a transition in
flight keeps its signals aside until the transition ends. No signal is dropped."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import transaction

from controlplane.core.state import Pool, Zone
from controlplane.models import Job, Worker
from controlplane.selectors.lending import lend_followups
from controlplane.services import dispatch

SIGNAL_PRIORITY = ("training_begin", "training_finished", "step_start", "capacity_change", "periodic")


def enqueue_plan(job_id: int, signal: str) -> None:
    """Ask a Celery worker to re-plan the job once this transaction commits (ids, never objects).

    Single flight per job: the signal joins the job's queue in Redis and a plan task is sent only if
    none is queued or running; that task plans once for every signal queued meanwhile (one plan sees
    the current state anyway; the decision records the weightiest signal). No signal is dropped."""
    transaction.on_commit(lambda: _enqueue_now(job_id, signal), robust=True)


def _enqueue_now(job_id: int, signal: str) -> None:
    r = dispatch.redis_client()
    r.rpush(f"pearl:plan:{job_id}", signal)
    r.expire(f"pearl:plan:{job_id}", 3600)
    if r.set(f"pearl:plan:{job_id}:queued", "1", nx=True, ex=300):
        dispatch.plan_job(job_id)


def replan_live_jobs(signal: str, *, node_id: int | None = None, node_ids: Iterable[int] | None = None) -> None:
    """A capacity change: re-plan every live job (or, with `node_id` / `node_ids`, those with a worker there:
    once each, however many of the nodes it has workers on)."""
    jobs = Job.objects.filter(status__in=[Job.Status.PENDING, Job.Status.RUNNING])
    if node_id is not None or node_ids is not None:
        ids = ([node_id] if node_id is not None else []) + list(node_ids or [])
        jobs = jobs.filter(pk__in=Worker.objects.filter(node_id__in=ids).values("job_id"))
    for job_id in jobs.values_list("id", flat=True):
        enqueue_plan(job_id, signal)
    enqueue_arbitration("capacity change")


ARBITER_KEY = "pearl:arbiter"


def enqueue_arbitration(reason: str) -> None:
    """A cluster event (a job arrived or ended, capacity changed, a job paused, resumed or changed training
    phase: `enqueue_phase_arbitration`): once this transaction commits, one arbiter task divides the cluster
    again and plans the jobs whose allotment changed, one after the other (`tasks.arbitrate`). Single flight,
    like a job's plan queue: one task at a time divides once for every event queued meanwhile; no reason is
    dropped."""
    transaction.on_commit(lambda: _arbitrate_now(reason), robust=True)


def phase_arbitration_reason(job: Job, *, training: bool) -> str | None:
    """Why a Training Begin / Finished of `job` divides the cluster again ('a Training Begin'), or None when no
    other job shares the cluster: a lone job's phase change cannot move units between jobs, and each division
    refits every job's predictor on the Celery worker."""
    others = Job.objects.filter(status__in=[Job.Status.PENDING, Job.Status.RUNNING]).exclude(pk=job.pk)
    if not others.exists():
        return None
    return f"{job.name} {'Training Begin' if training else 'Training Finished'}"


def enqueue_phase_arbitration(job: Job, *, training: bool) -> None:
    """Training Begin / Finished: a division as on the other cluster events, single flight with them (a burst of
    phase changes divides once), where another job shares the cluster (`phase_arbitration_reason`)."""
    reason = phase_arbitration_reason(job, training=training)
    if reason is not None:
        enqueue_arbitration(reason)


def _arbitrate_now(reason: str) -> None:
    r = dispatch.redis_client()
    r.rpush(ARBITER_KEY, reason)
    r.expire(ARBITER_KEY, 3600)
    if r.set(f"{ARBITER_KEY}:queued", "1", nx=True, ex=60):  # a lost send heals within a minute
        dispatch.arbitrate()


def take_arbitration_reasons() -> str | None:
    """Every reason queued for the arbiter, in order and each once ('job b arrived; capacity change'), or
    None: the arbiter task is then no longer queued (a reason arriving right after sends a new one)."""
    r = dispatch.redis_client()
    pipe = r.pipeline()
    pipe.lrange(ARBITER_KEY, 0, -1)
    pipe.delete(ARBITER_KEY)
    raw, _ = pipe.execute()
    reasons = list(dict.fromkeys(x.decode() for x in raw))
    if not reasons:
        r.delete(f"{ARBITER_KEY}:queued")
        if r.llen(ARBITER_KEY) and r.set(f"{ARBITER_KEY}:queued", "1", nx=True, ex=60):
            return take_arbitration_reasons()
        return None
    return "; ".join(reasons)


def replan_short_jobs(*, exclude: int | None = None) -> None:
    """A transition stopped rollout workers: plan every live job that holds fewer dedicated rollout GPUs than
    the arbiter allots it, so it starts workers on the units just freed (after commit)."""
    jobs = Job.objects.filter(status__in=[Job.Status.PENDING, Job.Status.RUNNING], allotted_rollout_gpus__gt=0)
    if exclude is not None:
        jobs = jobs.exclude(pk=exclude)
    for job_id, tp, allotted in jobs.values_list("id", "tp", "allotted_rollout_gpus"):
        held = (
            Worker.objects.filter(
                job_id=job_id, alive=True, zone=Zone.ROLLOUT, node__pool__in=[Pool.RESERVED, Pool.ELASTIC]
            ).count()
            * tp
        )  # its share: not its workers on other jobs' lent training GPUs
        if held < (allotted or 0):
            enqueue_plan(job_id, "capacity_change")
    for job_id in sorted(lend_followups() - {exclude}):  # cross-job lends (services.lending) to fill or end
        enqueue_plan(job_id, "capacity_change")


def defer_plan(job_id: int, signal: str) -> None:
    """The job has a transition in flight: keep the signal until it ends (`resume_deferred_plans`)."""
    r = dispatch.redis_client()
    r.rpush(f"pearl:plan:{job_id}:deferred", signal)
    r.expire(f"pearl:plan:{job_id}:deferred", 3600)


def _take_all(r: Any, key: str) -> set[str]:
    """Every distinct signal in a Redis list, taking the list (read and delete in one transaction)."""
    pipe = r.pipeline()
    pipe.lrange(key, 0, -1)
    pipe.delete(key)
    raw, _ = pipe.execute()
    return {x.decode() for x in raw}


def resume_deferred_plans(job_id: int) -> None:
    """A transition of the job ended: the signals that came meanwhile are planned now (after commit)."""

    def resume() -> None:
        for signal in _take_all(dispatch.redis_client(), f"pearl:plan:{job_id}:deferred"):
            _enqueue_now(job_id, signal)

    transaction.on_commit(resume, robust=True)


def take_plan_signals(job_id: int) -> str | None:
    """The weightiest signal queued for the job (all of them are taken), or None: then the job's plan
    task is no longer queued (a signal arriving right after sends a new one)."""
    r = dispatch.redis_client()
    key = f"pearl:plan:{job_id}"
    signals = _take_all(r, key)
    if not signals:
        r.delete(f"{key}:queued")
        if r.llen(key) and r.set(f"{key}:queued", "1", nx=True, ex=300):
            return take_plan_signals(job_id)  # one arrived between the two calls: this task takes it
        return None
    return min(signals, key=lambda s: SIGNAL_PRIORITY.index(s) if s in SIGNAL_PRIORITY else len(SIGNAL_PRIORITY))
