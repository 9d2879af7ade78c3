"""Worker lifecycle on the GPU–worker–role map: start, change role/activity (as a group), stop."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.db import IntegrityError, transaction
from django.utils import timezone

from controlplane.core.state import Activity, NodeStatus, Pool, Role, Zone
from controlplane.models import GPU, Job, Node, Worker, WorkerGPU
from controlplane.services.errors import Conflict, InvalidInput, InvariantViolation, NotFound
from controlplane.services.events import emit
from controlplane.services.invariants import assert_invariants
from controlplane.services.locks import lock_job, lock_nodes, locked
from controlplane.services.nodes import bump_generation, push_node

MAX_WORKER_GPUS = 16


def _role(value: str) -> Role:
    try:
        return Role(value)
    except ValueError:
        raise InvalidInput(f"unknown role {value!r}; expected one of {[r.value for r in Role]}", field="role") from None


def _activity(value: str) -> Activity:
    try:
        return Activity(value)
    except ValueError:
        raise InvalidInput(
            f"unknown activity {value!r}; expected one of {[a.value for a in Activity]}", field="activity"
        ) from None


def _lowest_free_slot(job: Job) -> int:
    taken = set(Worker.objects.filter(job=job, alive=True).values_list("slot", flat=True))
    slot = 0
    while slot in taken:
        slot += 1
    return slot


def start_worker(
    *,
    job_id: int,
    node_id: int,
    gpu_indexes: list[int],
    role: str,
    activity: str = Activity.TRANSITIONING,
    slot: int | None = None,
    actor: str = "system",
) -> Worker:
    """Bind a new worker to GPUs of one node. Its GPU set G_w is fixed for life."""
    role_, activity_ = _role(role), _activity(activity)
    if not gpu_indexes or len(gpu_indexes) > MAX_WORKER_GPUS:
        raise InvalidInput(f"a worker needs 1..{MAX_WORKER_GPUS} GPUs", field="gpus")
    if len(set(gpu_indexes)) != len(gpu_indexes):
        raise InvalidInput("a worker's GPUs must be distinct", field="gpus")
    with transaction.atomic():
        job = lock_job(job_id, field="job", live="it cannot get new workers")
        node = locked(Node.objects.filter(pk=node_id)).first()
        if node is None:
            raise NotFound(f"node {node_id} does not exist", field="node")
        if node.status != NodeStatus.READY:
            raise Conflict(f"node {node.name} is {node.status}; new workers go only to ready nodes", field="node")
        zone = Zone.OVERLAP if node.pool == Pool.TRAINING else Zone.ROLLOUT
        if role_ is Role.TRAINING and zone is not Zone.OVERLAP:
            raise InvalidInput("training workers live on training nodes", field="role")
        gpus = list(locked(GPU.objects.filter(node=node, index__in=gpu_indexes, present=True)).order_by("index"))
        if len(gpus) != len(gpu_indexes):
            missing = sorted(set(gpu_indexes) - {g.index for g in gpus})
            raise InvalidInput(f"node {node.name} has no GPU slot(s) {missing}", field="gpus")
        if slot is None:
            slot = _lowest_free_slot(job)
        elif Worker.objects.filter(job=job, slot=slot, alive=True).exists():
            raise Conflict(f"slot {slot} of job {job.name} is taken", field="slot")
        kind = "training" if role_ is Role.TRAINING else "rollout"
        try:
            with transaction.atomic():
                worker = Worker.objects.create(
                    job=job,
                    slot=slot,
                    node=node,
                    zone=zone,
                    role=role_,
                    activity=activity_,
                    engine=job.engine,
                    generation=node.generation + 1,
                )
                WorkerGPU.objects.bulk_create(
                    [
                        WorkerGPU(worker=worker, gpu=g, kind=kind, alive=True, active=activity_ is Activity.ACTIVE)
                        for g in gpus
                    ]
                )
        except IntegrityError as exc:  # database backstop: someone else holds the GPU or slot
            raise InvariantViolation(
                f"GPU(s) {gpu_indexes} of node {node.name} are taken: {exc}", field="gpus"
            ) from None
        assert_invariants(job_ids=[job.pk], gpu_ids=[g.pk for g in gpus])
        bump_generation(node)
        emit(
            kind="worker.started",
            message=f"{job.name}: worker {slot} ({role_}) on {node.name} GPUs {gpu_indexes}",
            job=job,
            node=node,
            actor=actor,
            data={"slot": slot, "role": role_, "activity": activity_, "gpus": gpu_indexes},
        )
        push_node(node.pk)
    return worker


@dataclass(frozen=True, slots=True)
class WorkerChange:
    slot: int
    role: str | None = None
    activity: str | None = None


def change_workers(*, job_id: int, changes: list[WorkerChange], actor: str = "system") -> list[Worker]:
    """Apply role/activity changes to several workers of a job atomically (e.g. admitting a whole
    disaggregated group at once). The invariants are checked once, on the result."""
    if not changes:
        raise InvalidInput("no changes given", field="changes")
    with transaction.atomic():
        job = lock_job(job_id, field="job")
        slots = [c.slot for c in changes]
        if len(set(slots)) != len(slots):
            raise InvalidInput("each worker may appear once", field="changes")
        live = Worker.objects.filter(job=job, alive=True, slot__in=slots)
        held = lock_nodes(live.values_list("node_id", flat=True))  # the lock order: their nodes, then the workers
        workers = {w.slot: w for w in locked(live).order_by("pk")}
        missing = sorted(set(slots) - set(workers))
        if missing:
            raise NotFound(f"job {job.name} has no live worker in slot(s) {missing}", field="slot")
        nodes: set[int] = set()
        touched: list[Worker] = []
        for c in changes:
            w = workers[c.slot]
            old = (w.role, w.activity)
            if c.role is not None:
                new_role = _role(c.role)
                if new_role != w.role:
                    if Role.TRAINING in (new_role, Role(w.role)):
                        raise Conflict("training workers never change role", field="role")
                    target_activity = _activity(c.activity) if c.activity else Activity(w.activity)
                    if w.activity == Activity.ACTIVE and target_activity is Activity.ACTIVE:
                        raise Conflict(f"worker {w.slot} is active; drain it before changing its role", field="role")
                    w.role = new_role
            if c.activity is not None:
                w.activity = _activity(c.activity)
            if (w.role, w.activity) != old:
                w.generation += 1
                w.save(update_fields=["role", "activity", "generation", "updated"])
                nodes.add(w.node_id)
                touched.append(w)
        # The pure check reads the new worker rows and explains a violation; then the bindings follow,
        # with the database constraints as the backstop.
        assert_invariants(
            job_ids=[job.pk],
            gpu_ids=list(WorkerGPU.objects.filter(worker__in=touched).values_list("gpu_id", flat=True)),
        )
        try:
            with transaction.atomic():
                for w in touched:
                    WorkerGPU.objects.filter(worker=w).update(active=w.activity == Activity.ACTIVE)
        except IntegrityError as exc:
            raise InvariantViolation(f"a GPU would get two active workers: {exc}") from None
        for node_id in sorted(nodes):
            bump_generation(held[node_id])
            push_node(node_id)
        if touched:
            emit(
                kind="worker.changed",
                message=f"{job.name}: " + ", ".join(f"w{w.slot}→{w.role}/{w.activity}" for w in touched),
                job=job,
                actor=actor,
                data={"changes": [{"slot": w.slot, "role": w.role, "activity": w.activity} for w in touched]},
            )
    return touched


def take_out(job_id: int, actor: str, change: Callable[[], object]) -> None:
    """Take workers out of service (drain, deactivate, stop) with `change`. If the workers left serving
    would no longer form a valid configuration (the last prefill or decode worker goes: a mode switch, a
    return of a borrowed decode worker, a preempted one), the whole serving group pauses first: admission
    stops until a finalize step admits the new group at once."""
    try:
        with transaction.atomic():
            change()
    except InvariantViolation:
        group = list(
            Worker.objects.filter(job_id=job_id, alive=True, activity=Activity.ACTIVE)
            .exclude(role=Role.TRAINING)
            .values_list("slot", flat=True)
        )
        change_workers(
            job_id=job_id, changes=[WorkerChange(s, activity=Activity.TRANSITIONING) for s in group], actor=actor
        )
        change()


def return_borrowed(job: Job, actor: str = "system") -> list[int]:
    """Training Begin: every borrowed overlap worker (serving or still being lent) goes back to the
    trainer now, in the caller's transaction: its agent aborts in-flight turns (their callers resume
    them elsewhere from their prefixes) and puts it to sleep. The return is due by a deadline, so it
    does not wait for a re-plan; the plan that follows sees the workers parked. Returns their slots."""
    lent = sorted(
        Worker.objects.filter(job=job, alive=True, zone=Zone.OVERLAP)
        .exclude(role=Role.TRAINING)
        .exclude(activity=Activity.INACTIVE)
        .values_list("slot", flat=True)
    )
    if lent:
        take_out(
            job.pk,
            actor,
            lambda: change_workers(
                job_id=job.pk, changes=[WorkerChange(s, activity=Activity.INACTIVE) for s in lent], actor=actor
            ),
        )
    return lent


def stop_worker(*, job_id: int, slot: int, actor: str = "system") -> Worker:
    """Stop a worker: it leaves the map (its row stays as history) and its slot becomes free."""
    with transaction.atomic():
        live = Worker.objects.filter(job_id=job_id, slot=slot, alive=True)
        lock_nodes(live.values_list("node_id", flat=True))  # the lock order: its node, then the worker
        worker = locked(live.select_related("job", "node")).first()
        if worker is None:
            raise NotFound(f"job {job_id} has no live worker in slot {slot}", field="slot")
        worker.alive = False
        worker.activity = Activity.INACTIVE
        worker.stopped_at = timezone.now()
        worker.save(update_fields=["alive", "activity", "stopped_at", "updated"])
        WorkerGPU.objects.filter(worker=worker).update(alive=False, active=False)
        assert_invariants(job_ids=[job_id])
        bump_generation(worker.node)
        emit(
            kind="worker.stopped",
            message=f"{worker.job.name}: worker {slot} stopped",
            job=worker.job,
            node=worker.node,
            actor=actor,
            data={"slot": slot},
        )
        push_node(worker.node_id)
    return worker
