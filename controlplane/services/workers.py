"""Worker lifecycle on the GPU–worker–role map: start, change role/activity (as a group), stop."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from controlplane.core.state import Activity, NodeStatus, Pool, Role, Zone
from controlplane.models import GPU, Event, Job, Worker, WorkerGPU
from controlplane.selectors.driver import observed
from controlplane.selectors.lending import on_owner_gpus
from controlplane.services.errors import Conflict, InvalidInput, InvariantViolation, NotFound
from controlplane.services.events import emit, emit_many
from controlplane.services.invariants import assert_invariants, checked_once
from controlplane.services.locks import lock_job, lock_nodes, locked
from controlplane.services.nodes import bump_generations, push_nodes

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


@dataclass(frozen=True, slots=True)
class WorkerStart:
    """One new worker: its node, its GPU slots there (G_w, fixed for life), role, activity, job slot."""

    node_id: int
    gpu_indexes: list[int]
    role: str
    activity: str = Activity.TRANSITIONING
    slot: int | None = None


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
    return start_workers(job_id=job_id, starts=[WorkerStart(node_id, gpu_indexes, role, activity, slot)], actor=actor)[
        0
    ]


def start_workers(*, job_id: int, starts: list[WorkerStart], actor: str = "system") -> list[Worker]:
    """Bind several new workers of a job at once (a transition's bring-ups): one transaction, one invariant
    check on the result, one new generation (one desired-state message) per node, however many workers
    a node gets."""
    if not starts:
        raise InvalidInput("no workers given", field="workers")
    for st in starts:
        _role(st.role), _activity(st.activity)
        if not st.gpu_indexes or len(st.gpu_indexes) > MAX_WORKER_GPUS:
            raise InvalidInput(f"a worker needs 1..{MAX_WORKER_GPUS} GPUs", field="gpus")
        if len(set(st.gpu_indexes)) != len(st.gpu_indexes):
            raise InvalidInput("a worker's GPUs must be distinct", field="gpus")
    with transaction.atomic():
        job = lock_job(job_id, field="job", live="it cannot get new workers")
        held = lock_nodes(st.node_id for st in starts)
        for st in starts:
            node = held.get(st.node_id)
            if node is None:
                raise NotFound(f"node {st.node_id} does not exist", field="node")
            if node.status != NodeStatus.READY:
                raise Conflict(f"node {node.name} is {node.status}; new workers go only to ready nodes", field="node")
            if _role(st.role) is Role.TRAINING and node.pool != Pool.TRAINING:
                raise InvalidInput("training workers live on training nodes", field="role")
        by_node: dict[int, set[int]] = {}
        for st in starts:
            by_node.setdefault(st.node_id, set()).update(st.gpu_indexes)
        gpu_q = Q()
        for node_id, idx in by_node.items():
            gpu_q |= Q(node_id=node_id, index__in=sorted(idx))
        gpus = {(g.node_id, g.index): g for g in locked(GPU.objects.filter(gpu_q, present=True)).order_by("pk")}
        taken = set(Worker.objects.filter(job=job, alive=True).values_list("slot", flat=True))
        # a rollout worker on another job's training GPUs (a lent unit, `services.lending`) serves that job's
        # rollout as a dedicated worker would: its zone is rollout; on its own job's (or no job's) it is overlap
        lending = any(held[st.node_id].pool == Pool.TRAINING and _role(st.role) is not Role.TRAINING for st in starts)
        foreign = (
            set(
                WorkerGPU.objects.filter(alive=True, kind="training", gpu__in=list(gpus.values()))
                .exclude(worker__job=job)
                .values_list("gpu_id", flat=True)
            )
            if lending
            else set()
        )
        zones = [
            Zone.ROLLOUT
            if held[st.node_id].pool != Pool.TRAINING
            or (
                _role(st.role) is not Role.TRAINING
                and any(g.pk in foreign for g in (gpus.get((st.node_id, i)) for i in st.gpu_indexes) if g is not None)
            )
            else Zone.OVERLAP
            for st in starts
        ]
        slots: list[int] = []
        for st in starts:
            missing = sorted(i for i in st.gpu_indexes if (st.node_id, i) not in gpus)
            if missing:
                raise InvalidInput(f"node {held[st.node_id].name} has no GPU slot(s) {missing}", field="gpus")
            if st.slot is None:
                slot = 0
                while slot in taken:
                    slot += 1
            elif st.slot in taken:
                raise Conflict(f"slot {st.slot} of job {job.name} is taken", field="slot")
            else:
                slot = st.slot
            taken.add(slot)
            slots.append(slot)
        try:
            with transaction.atomic():
                workers = Worker.objects.bulk_create(
                    [
                        Worker(
                            job=job,
                            slot=slot,
                            node=held[st.node_id],
                            zone=zone,
                            role=_role(st.role),
                            activity=_activity(st.activity),
                            engine=job.engine,
                            generation=held[st.node_id].generation + 1,
                        )
                        for st, slot, zone in zip(starts, slots, zones, strict=True)
                    ]
                )
                WorkerGPU.objects.bulk_create(
                    [
                        WorkerGPU(
                            worker=w,
                            gpu=gpus[(st.node_id, i)],
                            kind="training" if _role(st.role) is Role.TRAINING else "rollout",
                            alive=True,
                            active=_activity(st.activity) is Activity.ACTIVE,
                        )
                        for st, w in zip(starts, workers, strict=True)
                        for i in st.gpu_indexes
                    ]
                )
        except IntegrityError as exc:  # database backstop: someone else holds a GPU or slot
            raise InvariantViolation(f"GPU(s) or slot(s) are taken: {exc}", field="gpus") from None
        assert_invariants(job_ids=[job.pk], gpu_ids=[g.pk for g in gpus.values()])
        bump_generations(held[node_id] for node_id in sorted(by_node))
        push_nodes(by_node)
        per_node: dict[int, list[tuple[WorkerStart, Worker]]] = {}
        for st, w in zip(starts, workers, strict=True):
            per_node.setdefault(st.node_id, []).append((st, w))
        emit_many(  # one timeline entry per node
            [
                Event(
                    kind="worker.started",
                    message=f"{job.name}: "
                    + ", ".join(
                        f"worker {w.slot} ({w.role}) on {held[node_id].name} GPUs {st.gpu_indexes}" for st, w in mine
                    ),
                    job=job,
                    node=held[node_id],
                    actor=actor,
                    data={
                        "slot": mine[0][1].slot,
                        "role": mine[0][1].role,
                        "activity": mine[0][1].activity,
                        "gpus": mine[0][0].gpu_indexes,
                        "workers": [{"slot": w.slot, "role": w.role, "gpus": st.gpu_indexes} for st, w in mine],
                    },
                )
                for node_id, mine in sorted(per_node.items())
            ]
        )
    return workers


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
        now = timezone.now()
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
                w.updated = now
                nodes.add(w.node_id)
                touched.append(w)
        # one statement per (role, activity) the group ends in, however large the group: a bulk_update's
        # CASE per row costs more to build than the change itself at thousands of workers
        ending: dict[tuple[str, str], list[int]] = {}
        for w in touched:
            ending.setdefault((w.role, w.activity), []).append(w.pk)
        for (role, activity), ids in ending.items():
            Worker.objects.filter(pk__in=ids).update(
                role=role, activity=activity, generation=F("generation") + 1, updated=now
            )
        # The pure check reads the new worker rows and explains a violation; then the bindings follow,
        # with the database constraints as the backstop.
        assert_invariants(
            job_ids=[job.pk],
            gpu_ids=list(WorkerGPU.objects.filter(worker__in=touched).values_list("gpu_id", flat=True)),
        )
        try:
            with transaction.atomic():  # the bindings that go inactive first, so a GPU never has two active
                WorkerGPU.objects.filter(worker__in=[w for w in touched if w.activity != Activity.ACTIVE]).update(
                    active=False
                )
                WorkerGPU.objects.filter(worker__in=[w for w in touched if w.activity == Activity.ACTIVE]).update(
                    active=True
                )
        except IntegrityError as exc:
            raise InvariantViolation(f"a GPU would get two active workers: {exc}") from None
        bump_generations(held[node_id] for node_id in sorted(nodes))
        push_nodes(nodes)
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
    """Take workers out of service (drain, deactivate, stop) with `change` (which may do more: an executor
    batch's bring-ups too), its invariants checked once. If the workers left serving would no longer form a
    valid configuration (the last prefill or decode worker goes: a mode switch, a return of a borrowed
    decode worker, a preempted one), the whole serving group pauses first: admission stops until a finalize
    step admits the new group at once."""
    try:
        with transaction.atomic(), checked_once():
            change()
    except InvariantViolation:
        with transaction.atomic(), checked_once():
            group = list(
                Worker.objects.filter(job_id=job_id, alive=True, activity=Activity.ACTIVE)
                .exclude(role=Role.TRAINING)
                .values_list("slot", flat=True)
            )
            if group:
                change_workers(
                    job_id=job_id,
                    changes=[WorkerChange(s, activity=Activity.TRANSITIONING) for s in group],
                    actor=actor,
                )
            change()


def return_borrowed(job: Job, actor: str = "system") -> list[int]:
    """Training Begin: every borrowed overlap worker (serving or still being lent) goes back to the
    trainer now, in the caller's transaction: its agent aborts in-flight turns (their callers resume
    them elsewhere from their prefixes) and puts it to sleep. The return is due by a deadline, so it
    does not wait for a re-plan; the plan that follows sees the workers parked. Other jobs' workers on
    its training GPUs (cross-job lends, `services.lending`) are parked the same way, each job's at once;
    their planners stop them. One whose agent does not report it running yet (its start, a process and
    the borrower's weights, is in flight) stops now instead: it could only sleep once started, which may
    take longer than the deadline, and the agent abandons a start it is no longer asked for. The
    owner's update waits until its agent no longer runs it (`selectors.lending.leaving_owner_gpus`).
    Returns the job's own slots."""
    foreign: dict[int, tuple[list[int], list[int]]] = {}  # borrower -> (slots to park, slots to stop)
    for w in on_owner_gpus(job):
        o = observed(w)  # its agent's last report: a start that ended since is stopped too, and retired at once
        if o is None or o.get("state") != "running":
            foreign.setdefault(w.job_id, ([], []))[1].append(w.slot)
        elif w.activity != Activity.INACTIVE:
            foreign.setdefault(w.job_id, ([], []))[0].append(w.slot)
    for borrower, (parks, stops) in sorted(foreign.items()):
        park = [WorkerChange(x, activity=Activity.INACTIVE) for x in sorted(parks)]

        def back(borrower: int = borrower, park: list[WorkerChange] = park, stops: list[int] = stops) -> None:
            if stops:
                stop_workers(job_id=borrower, slots=sorted(stops), actor=actor)
            if park:
                change_workers(job_id=borrower, changes=park, actor=actor)

        take_out(borrower, actor, back)
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
    return stop_workers(job_id=job_id, slots=[slot], actor=actor)[0]


def stop_workers(*, job_id: int, slots: list[int], actor: str = "system") -> list[Worker]:
    """Stop several workers of a job at once: one transaction, one invariant check, one new generation (one
    desired-state message) per node."""
    with transaction.atomic():
        live = Worker.objects.filter(job_id=job_id, slot__in=slots, alive=True)
        held = lock_nodes(live.values_list("node_id", flat=True))  # the lock order: their nodes, then the workers
        workers = list(locked(live.select_related("job")).order_by("pk"))
        missing = sorted(set(slots) - {w.slot for w in workers})
        if missing:
            what = f"slot {missing[0]}" if len(missing) == 1 else f"slots {missing}"
            raise NotFound(f"job {job_id} has no live worker in {what}", field="slot")
        now = timezone.now()
        ids = [w.pk for w in workers]
        Worker.objects.filter(pk__in=ids).update(alive=False, activity=Activity.INACTIVE, stopped_at=now)
        WorkerGPU.objects.filter(worker_id__in=ids).update(alive=False, active=False)
        for w in workers:
            w.alive, w.activity, w.stopped_at = False, Activity.INACTIVE, now
        assert_invariants(job_ids=[job_id])
        bump_generations(held[node_id] for node_id in sorted(held))
        per_node: dict[int, list[int]] = {}
        for w in workers:
            per_node.setdefault(w.node_id, []).append(w.slot)
        emit_many(  # one timeline entry per node
            [
                Event(
                    kind="worker.stopped",
                    message=f"{workers[0].job.name}: worker{'s' if len(mine) > 1 else ''} "
                    + ", ".join(map(str, mine))
                    + " stopped",
                    job=workers[0].job,
                    node=held[node_id],
                    actor=actor,
                    data={"slot": mine[0], "slots": mine},
                )
                for node_id, mine in ((n, sorted(per_node.get(n, []))) for n in sorted(held))
                if mine
            ]
        )
        push_nodes(held)
    order = {s: i for i, s in enumerate(slots)}
    return sorted(workers, key=lambda w: order[w.slot])
