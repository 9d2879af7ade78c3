"""The cluster map (nodes -> GPU slots -> workers) and per-node desired state."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from django.utils import timezone

from controlplane.core.agent_link import DesiredDriver, DesiredState, DesiredWorker
from controlplane.core.invariants import WorkerView
from controlplane.core.state import Activity, Role, Zone
from controlplane.models import GPU, Job, Node, Worker, WorkerGPU
from controlplane.selectors import leases
from controlplane.selectors.job_tokens import job_dataplane_token, job_driver_token, job_weights_key, job_weights_token


def _iso(value: Any) -> str | None:
    return value.isoformat() if value else None


# jobs whose rollout driver runs (a paused job's too: its loop keeps the step and its trajectories)
LIVE_JOBS = (Job.Status.PENDING, Job.Status.RUNNING, Job.Status.PAUSED)


def cluster_snapshot(*, node_ids: Iterable[int] | None = None) -> dict[str, Any]:
    """Nodes in stable (name) order, each with its GPU slots and the alive workers bound to them.

    Four queries whatever the cluster size; used by GET /api/cluster/, the dashboard and deltas.
    """
    now = timezone.now()
    nodes_qs = Node.objects.order_by("name")
    gpus_qs = GPU.objects.order_by("node_id", "index")
    bind_qs = WorkerGPU.objects.filter(alive=True)
    if node_ids is not None:
        ids = list(node_ids)
        nodes_qs = nodes_qs.filter(id__in=ids)
        gpus_qs = gpus_qs.filter(node_id__in=ids)
        bind_qs = bind_qs.filter(gpu__node_id__in=ids)
    workers_by_gpu: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for b in bind_qs.values(
        "gpu_id",
        "worker_id",
        "worker__slot",
        "worker__role",
        "worker__activity",
        "worker__job__name",
        "worker__weight_version",
        "gpu__hardware",
    ):
        workers_by_gpu[b["gpu_id"]].append(
            {
                "id": b["worker_id"],
                "job": b["worker__job__name"],
                "slot": b["worker__slot"],
                "role": b["worker__role"],
                "activity": b["worker__activity"],
                "weight_version": b["worker__weight_version"],
                "hardware": b["gpu__hardware"],  # the chip the worker runs on (one node's GPUs: one type)
            }
        )
    gpus_by_node: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for g in gpus_qs.values("id", "node_id", "index", "hardware", "memory_mb", "zone", "present"):
        # the active worker owns the slot; else, in the overlap zone, the training worker does
        ws = sorted(
            workers_by_gpu.get(g["id"], []),
            key=lambda w: (w["activity"] != Activity.ACTIVE, w["role"] != Role.TRAINING, w["job"], w["slot"]),
        )
        active = next((w for w in ws if w["activity"] == Activity.ACTIVE), None)
        gpus_by_node[g["node_id"]].append(
            {
                "id": g["id"],
                "index": g["index"],
                "hardware": g["hardware"],
                "memory_mb": g["memory_mb"],
                "zone": g["zone"],
                "present": g["present"],
                "role": active["role"] if active else (ws[0]["role"] if ws else None),
                "activity": active["activity"] if active else (ws[0]["activity"] if ws else "idle"),
                "workers": ws,
            }
        )
    nodes = []
    rows = list(
        nodes_qs.values(
            "id",
            "name",
            "pool",
            "status",
            "hardware",
            "engine",
            "epoch",
            "generation",
            "applied_generation",
            "last_heartbeat",
            "lease_expires",
            "preemption_deadline",
            "address",
            "ray_node_id",
            "ray_address",
        )
    )
    # the rows' last-seen is coarse while Redis renews the leases (services/leases.py): the renewal is newer
    renewed = leases.last_seen(n["id"] for n in rows)
    for n in rows:
        hb = max(filter(None, (n["last_heartbeat"], renewed.get(n["id"]))), default=None)
        nodes.append(
            {
                "id": n["id"],
                "name": n["name"],
                "pool": n["pool"],
                "zone": Zone.OVERLAP if n["pool"] == "training" else Zone.ROLLOUT,
                "status": n["status"],
                "hardware": n["hardware"],
                "engine": n["engine"],
                "epoch": n["epoch"],
                "generation": n["generation"],
                "applied_generation": n["applied_generation"],
                "last_heartbeat": _iso(hb),
                "heartbeat_age_s": (now - hb).total_seconds() if hb else None,
                "lease_expires": _iso(n["lease_expires"]),
                "preemption_deadline": _iso(n["preemption_deadline"]),
                "address": n["address"],  # where the agent dialled from (its data plane's host)
                "ray_node_id": n["ray_node_id"],  # set by the Ray bridge, "" otherwise
                "ray_address": n["ray_address"],
                "gpus": gpus_by_node.get(n["id"], []),
            }
        )
    return {"generated": now.isoformat(), "nodes": nodes}


def node_summary(node_id: int) -> dict[str, Any] | None:
    nodes = cluster_snapshot(node_ids=[node_id])["nodes"]
    return nodes[0] if nodes else None


def agent_desired_state(node_id: int, channel: str) -> DesiredState | None:
    """The node's desired state, for the agent socket holding its lease only (None for any other socket)."""
    node = Node.objects.filter(pk=node_id, agent_channel=channel).first()
    return desired_state(node) if node else None


def desired_state(node: Node) -> DesiredState:
    """The node's full desired state: every alive worker bound to its GPUs. Rollout workers get the
    job's weights URL (its trainer, as recorded here) and a scoped, rotating token for it; the job's
    trainer gets the job's key to verify such tokens; every worker of a job gets the job's data-plane
    token (its driver's). The node holding a live job's first training worker runs that job's
    rollout driver. No cluster-wide secret goes anywhere. Three queries, whatever the node holds (each
    node's agent is sent this after every change, so it is read once per node per change)."""
    indexes: dict[int, list[int]] = defaultdict(list)
    for wid, index in WorkerGPU.objects.filter(alive=True, gpu__node=node).values_list("worker_id", "gpu__index"):
        indexes[wid].append(index)
    rows = list(
        Worker.objects.filter(node=node, alive=True)
        .select_related("job")
        .only("id", "role", "activity", "engine", "job_id", *(f"job__{f}" for f in _DESIRED_JOB_FIELDS))
        .order_by("job_id", "slot")
    )
    jobs = {w.job_id: w.job for w in rows}
    weights_urls, first_trainer = _trainers(jobs)
    derived: dict[int, tuple[str, str, str]] = {}  # job id -> (weights token, weights key, data-plane token)
    workers = []
    for w in rows:
        if w.id not in indexes:
            # its bindings were not there when they were read: it started between the two reads (a start commits
            # the worker and its bindings at once; every live worker has GPUs). Sent with none, an agent would run
            # it unpinned and start it again when the next desired state gave it its GPUs; the next one lists it
            continue
        job = w.job
        if job.pk not in derived:
            url = weights_urls.get(job.pk, "")
            derived[job.pk] = (job_weights_token(job) if url else "", job_weights_key(job), job_dataplane_token(job))
        token, key, dataplane = derived[job.pk]
        training = w.role == Role.TRAINING
        workers.append(
            DesiredWorker(
                worker_id=w.id,
                gpus=sorted(indexes[w.id]),
                role=Role(w.role),
                activity=Activity(w.activity),
                engine=w.engine,
                model=job.model,
                job=job.name,
                min_weight_version=max(0, job.weight_version - job.max_staleness),
                weights_url="" if training else weights_urls.get(job.pk, ""),
                weights_token="" if training else token,
                weights_key=key if training else "",
                dataplane_token=dataplane,
                checkpoint_dir=job.checkpoint_dir if training else "",
                checkpoint_every=job.checkpoint_every if training else 0,
                checkpoint_keep=job.checkpoint_keep if training else 0,
                init_from=job.init_from if training else "",
            )
        )
    drivers = [
        DesiredDriver(job=j.name, token=job_driver_token(j))
        for j in sorted(jobs.values(), key=lambda j: j.name)
        if j.status in LIVE_JOBS and first_trainer.get(j.pk) == node.pk
    ]
    deadline = node.preemption_deadline.timestamp() if node.preemption_deadline else None
    return DesiredState(
        generation=node.generation,
        epoch=node.epoch,
        status=node.status,
        workers=workers,
        preemption_deadline=deadline,
        drivers=drivers,
    )


# what a desired state reads of a job (its identity for the derived secrets, the weights it allows, liveness)
_DESIRED_JOB_FIELDS = ("id", "name", "created", "model", "weight_version", "max_staleness", "status")


def _trainers(jobs: Iterable[int]) -> tuple[dict[int, str], dict[int, int]]:
    """For these jobs, in one query over their alive training workers: each job's weights URL (`weights_url`:
    the endpoint of its first training worker, by slot: the one trainer that takes its samples and updates, ""
    until that worker reports one) and the node of that worker (which runs its rollout driver). Not the first
    worker that has an endpoint: with several training workers starting, that one changed when an earlier slot
    came up, and a driver posted part of a step's samples to a trainer that then did not run its update."""
    urls: dict[int, str] = {}
    first: dict[int, int] = {}
    for job_id, node_id, endpoint in (
        Worker.objects.filter(job_id__in=list(jobs), alive=True, role=Role.TRAINING)
        .order_by("job_id", "slot")
        .values_list("job_id", "node_id", "endpoint")
    ):
        if job_id not in first:
            first[job_id] = node_id
            if endpoint:
                urls[job_id] = endpoint
    return urls, first


def weights_url(job_id: int) -> str:
    """Where the job's rollout workers pull weight snapshots: its trainer's endpoint, which the control
    plane records on the trainer node's own address (an agent cannot point it elsewhere). The weight-store
    base: workers pull <base>/weights/latest and <base>/weights/<v>."""
    return _trainers([job_id])[0].get(job_id, "")


def worker_views(*, job_ids: Iterable[int] | None = None, gpu_ids: Iterable[int] | None = None) -> list[WorkerView]:
    """Alive workers as pure views for `check_invariants` (restricted to jobs or GPUs touched)."""
    qs = Worker.objects.filter(alive=True)
    if job_ids is not None or gpu_ids is not None:
        from django.db.models import Q

        cond = Q()
        if job_ids is not None:
            cond |= Q(job_id__in=list(job_ids))
        if gpu_ids is not None:
            cond |= Q(bindings__gpu_id__in=list(gpu_ids), bindings__alive=True)
        qs = qs.filter(cond).distinct()
    gpus: dict[int, list[int]] = defaultdict(list)
    rows = list(qs.values("id", "job_id", "slot", "role", "activity", "zone"))
    for b in WorkerGPU.objects.filter(alive=True, worker_id__in=[r["id"] for r in rows]).values("worker_id", "gpu_id"):
        gpus[b["worker_id"]].append(b["gpu_id"])
    return [
        WorkerView(
            worker_id=r["id"],
            job=r["job_id"],
            slot=r["slot"],
            role=Role(r["role"]),
            activity=Activity(r["activity"]),
            zone=Zone(r["zone"]),
            gpus=tuple(sorted(gpus.get(r["id"], []))),
        )
        for r in rows
    ]


def training_flags(job_ids: Iterable[int]) -> dict[int, bool]:
    """Job id -> whether its trainer computes (a training worker is active)."""
    ids = list(job_ids)
    computing = set(
        Worker.objects.filter(job_id__in=ids, alive=True, role=Role.TRAINING, activity=Activity.ACTIVE).values_list(
            "job_id", flat=True
        )
    )
    return {j: j in computing for j in ids}
