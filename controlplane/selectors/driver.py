"""What a job's rollout driver is told (the driver link's read models)."""

from __future__ import annotations

import math
from typing import Any

from django.conf import settings
from django.db.models import Count

from controlplane.core import driver_link as dl
from controlplane.core.policies import policy_class
from controlplane.core.predictor import prior_serving_rates
from controlplane.core.profiles import dispatch_cap, get_profile
from controlplane.core.state import Activity, NodeStatus, Role, Zone
from controlplane.models import Decision, Job, Worker
from controlplane.selectors.cluster import weights_url
from controlplane.selectors.job_tokens import job_dataplane_token
from controlplane.selectors.lending import leaving_owner_gpus, on_owner_gpus
from controlplane.selectors.model_dirs import ensure_profile


def observed(worker: Worker) -> dict[str, Any] | None:
    """What the worker's agent last reported of it (None: not reported)."""
    for o in worker.node.observed or []:
        if o.get("worker_id") == worker.pk:
            return o
    return None


def serving(worker: Worker, min_version: int) -> bool:
    """Routable: active here, and its agent reports it awake, in its role, with weights the job allows."""
    o = observed(worker)
    return (
        worker.activity == Activity.ACTIVE
        and worker.node.status == NodeStatus.READY
        and bool(worker.endpoint)
        and o is not None
        and o.get("state") == "running"
        and o.get("role") == worker.role
        and o.get("activity") == Activity.ACTIVE
        and int(o.get("weight_version", 0)) >= min_version
    )


def returned(worker: Worker) -> bool:
    """A borrowed overlap worker is back on the trainer's side: parked here and, if its agent is up,
    reported asleep with nothing in flight."""
    if worker.activity != Activity.INACTIVE:
        return False
    if worker.node.status != NodeStatus.READY:
        return True  # its agent is gone: the worker is fenced
    o = observed(worker)
    return o is None or (o.get("activity") == Activity.INACTIVE and int(o.get("inflight", 0)) == 0)


def not_returned(job: Job) -> list[Worker]:
    """The job's overlap rollout workers, and other jobs' workers on its training GPUs (cross-job lends), that
    are not (yet) back: parked but not reported asleep, or stopped but still run by their agent."""
    ws = list(
        Worker.objects.filter(job=job, alive=True, zone=Zone.OVERLAP).exclude(role=Role.TRAINING).select_related("node")
    )
    return [w for w in ws + on_owner_gpus(job) if not returned(w)] + leaving_owner_gpus(job)


def job_view(job: Job) -> dl.JobView:
    ensure_profile(job.model)  # a model directory's derived profile, for get_profile below
    dispatch = policy_class(job.policy).dispatch
    return dl.JobView(
        name=job.name,
        environment=job.environment,
        model=job.model,
        engine=job.engine,
        batch_size=job.batch_size,
        group_size=job.group_size,
        max_staleness=job.max_staleness,
        max_trajectory_tokens=job.max_trajectory_tokens,
        training_gpus=job.training_gpus,
        return_deadline_s=float(settings.PEARL["RETURN_DEADLINE_S"]),
        seed=job.pk,
        agent=dict(job.agent or {}),
        dispatch=dispatch,
        dispatch_cap=dispatch_cap(dispatch, get_profile(job.hardware, job.model, job.tp), job.max_trajectory_tokens),
    )


def job_welcome(job_id: int) -> dl.Welcome:
    """The driver link's `welcome` for the job (the driver socket holds only its job's id)."""
    return welcome(Job.objects.get(pk=job_id))


def job_cluster_view(job_id: int) -> dl.ClusterView:
    """The job's cluster view, pushed to its driver after each change."""
    return cluster_view(Job.objects.get(pk=job_id))


def welcome(job: Job) -> dl.Welcome:
    return dl.Welcome(
        job=job_view(job),
        cluster=cluster_view(job),
        dataplane_token=job_dataplane_token(job),
        checkpoint=dict(job.loop_state or {}),
    )


def cluster_view(job: Job) -> dl.ClusterView:
    # only workers holding the latest published weights get turns (RLBoost, PEARL: lazy pull, then
    # admission): whatever step is in flight, its requests then never find a worker too far behind
    min_version = job.weight_version
    ensure_profile(job.model)
    chips = tuple(sorted({h.upper() for h in (job.hardware, *job.rollout_hardware)}))
    rates = prior_serving_rates(job.model, chips, job.tp, job.max_trajectory_tokens) if len(chips) > 1 else {}
    workers = [
        dl.RoutableWorker(
            worker=w.slot,
            role=Role(w.role),
            endpoint=w.endpoint,
            overlap=w.zone == Zone.OVERLAP,
            gpus=max(1, w.gpu_count),
            weight_version=int((observed(w) or {}).get("weight_version", 0)),
            rate=rates.get(w.node.hardware.upper(), 1.0),
        )
        for w in (
            Worker.objects.filter(job=job, alive=True, activity=Activity.ACTIVE)
            .exclude(role=Role.TRAINING)
            .select_related("node")
            .annotate(gpu_count=Count("bindings"))
            .order_by("slot")
        )
        if serving(w, min_version)
    ]
    return dl.ClusterView(
        workers=workers,
        weight_version=job.weight_version,
        training_active=job.training_active,
        borrowed=len(not_returned(job)),
        trainer=weights_url(job.pk),
        stopped=job.status in (Job.Status.STOPPED, Job.Status.FAILED),
        decision=decision_view(job),
    )


def decision_view(job: Job) -> dl.DecisionView | None:
    d = Decision.objects.filter(job=job).first()
    if d is None:
        return None
    pred = d.predicted_makespan_s
    return dl.DecisionView(
        id=d.pk,
        signal=d.signal,
        mode=d.mode,
        n_prefill=d.n_prefill,
        n_decode=d.n_decode,
        n_colocated=d.n_colocated,
        predicted_makespan_s=pred if pred is not None and math.isfinite(pred) and pred > 0 else 0.0,
        reconfigured=d.transitions.exists(),
    )
