"""Cross-job borrowing (issue 35), the reads: each job's training units and who holds them, what an owner may
lend, when it next needs its units back, and what a borrower's planner may use (`services.lending` writes)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import pairwise

from django.conf import settings
from django.db.models import Count, F, Q

from controlplane.core.state import Activity, NodeStatus, Pool, Role, Zone
from controlplane.core.telemetry import TelemetryRecord
from controlplane.core.transitions import StepKind
from controlplane.models import (
    Event,
    Job,
    Node,
    TelemetrySample,
    TrainingLend,
    Transition,
    TransitionStep,
    Worker,
    WorkerGPU,
)

ACTIVE_TRANSITION = (Transition.Status.PENDING, Transition.Status.RUNNING)
TB_HISTORY = 6  # Training Begins read to predict the next one


@dataclass(frozen=True, slots=True)
class TrainingUnit:
    """One `tp` group of a job's training GPUs and the rollout worker on it, if any (the owner's overlap worker
    or a borrower's), or the job whose unfinished transition is about to start one there."""

    node_id: int
    gpus: tuple[int, ...]  # GPU indexes on the node
    occupant_job: int | None
    occupant_slot: int | None = None
    occupant_activity: str = ""


def claims() -> dict[tuple[int, int], int]:
    """(node id, GPU index) -> the job whose unfinished transition starts a worker there (planned for it, maybe
    not bound yet): jobs planned one after the other must not both pick those GPUs."""
    out: dict[tuple[int, int], int] = {}
    for job_id, args in TransitionStep.objects.filter(
        kind=StepKind.START_WORKER, transition__status__in=ACTIVE_TRANSITION
    ).values_list("transition__job_id", "args"):
        for i in args.get("gpus", []):
            out[(int(args["node"]), int(i))] = job_id
    return out


def training_units(
    owner: Job, claimed: dict[tuple[int, int], int] | None = None, *, tp: int | None = None
) -> list[TrainingUnit]:
    """The owner's training units in its training workers' slot order, each with its rollout occupant (the
    first worker found on its GPUs). With `tp` (a borrower's, other than the owner's): its training GPUs cut
    into groups of `tp` on each node instead, in node and index order (each group one worker of the borrower:
    half an owner's TP2 unit, or two of its TP1 units side by side), a group left short on a node dropped."""
    groups: dict[int, tuple[int, int, list[tuple[int, int]]]] = {}  # worker id -> (slot, node, [(index, gpu id)])
    for wid, slot, node_id, index, gid in (
        WorkerGPU.objects.filter(alive=True, kind="training", worker__job=owner, worker__alive=True)
        .order_by("worker__slot", "gpu__index")
        .values_list("worker_id", "worker__slot", "worker__node_id", "gpu__index", "gpu_id")
    ):
        groups.setdefault(wid, (slot, node_id, []))[2].append((index, gid))
    gpu_ids = {gid for _, _, pairs in groups.values() for _, gid in pairs}
    on: dict[int, tuple[int, int, str]] = {
        gid: (job_id, slot, activity)
        for gid, job_id, slot, activity in WorkerGPU.objects.filter(
            alive=True, kind="rollout", gpu_id__in=gpu_ids
        ).values_list("gpu_id", "worker__job_id", "worker__slot", "worker__activity")
    }
    claimed = claims() if claimed is None else claimed
    cut: list[tuple[int, list[tuple[int, int]]]] = [(node_id, pairs) for _, node_id, pairs in sorted(groups.values())]
    if tp is not None and tp != owner.tp:
        per_node: dict[int, list[tuple[int, int]]] = {}
        for node_id, pairs in cut:
            per_node.setdefault(node_id, []).extend(pairs)
        cut = [
            (node_id, pairs[i : i + tp])
            for node_id, all_pairs in sorted(per_node.items())
            for pairs in [sorted(all_pairs)]
            for i in range(0, len(pairs) - tp + 1, tp)
        ]
    out = []
    for node_id, pairs in cut:
        occ = next((on[g] for _, g in pairs if g in on), None)
        if occ is not None:
            out.append(TrainingUnit(node_id, tuple(i for i, _ in pairs), occ[0], occ[1], occ[2]))
        else:
            by = next((claimed[(node_id, i)] for i, _ in pairs if (node_id, i) in claimed), None)
            out.append(TrainingUnit(node_id, tuple(i for i, _ in pairs), by))
    return out


def in_transition(job: Job) -> set[int]:
    """Slots the job's unfinished transitions touch (an overlap worker about to be lent to its own rollout)."""
    return {
        s
        for s in TransitionStep.objects.filter(
            transition__job=job, transition__status__in=ACTIVE_TRANSITION
        ).values_list("worker_slot", flat=True)
        if s is not None
    }


def lendable_units(owner: Job) -> int:
    """The owner's training units it may lend now: none while its trainer computes; else those asleep (its
    parked overlap worker, not part of a transition of its own), empty, or already lent."""
    return len(lendable_training_units(owner))


def lendable_training_units(owner: Job) -> list[TrainingUnit]:
    """Those units themselves (`lendable_units` counts them)."""
    if owner.training_active:
        return []
    busy = in_transition(owner)
    return [
        u
        for u in training_units(owner)
        if u.occupant_job != owner.pk
        or (u.occupant_activity == Activity.INACTIVE and u.occupant_slot is not None and u.occupant_slot not in busy)
    ]


def lendable_groups(owner: Job, lendable: list[TrainingUnit], tps: Iterable[int]) -> dict[int, int]:
    """For each TP here a multiple of the owner's and larger: how many of that TP's workers its `lendable`
    training units (`lendable_training_units`) hold, each on `tp` GPUs side by side on one node
    (`training_units(..., tp=)`'s cut, as the borrower's planner places them). Two idle TP1 units on two nodes
    hold no TP2 worker."""
    sizes = {t for t in tps if t > owner.tp and t % owner.tp == 0}
    if not sizes:
        return {}
    free = {(u.node_id, i) for u in lendable for i in u.gpus}
    return {
        t: sum(1 for g in training_units(owner, tp=t) if all((g.node_id, i) in free for i in g.gpus)) for t in sizes
    }


@dataclass(frozen=True, slots=True)
class Cadence:
    """A job's update rhythm in its loop's clock (the clock its telemetry and predictor use: wall time for real
    engines, an emulated job's scaled time) and how that clock maps to wall time."""

    period_s: float  # between its Training Begins, loop seconds (the median of its recent ones)
    return_s: float  # its borrowed workers' return at Training Begin, loop seconds (the median)
    scale: float  # wall seconds per loop second (1 for real engines; an emulated job's time factor)
    last_begin_wall_s: float  # its last Training Begin, epoch seconds
    update_s: float = 0.0  # its trainer's update, loop seconds (the median): the part of a period it trains

    def until_next_begin_s(self, now_wall_s: float) -> float:
        """Loop seconds to its next Training Begin (0 if overdue)."""
        return max(0.0, self.period_s - (now_wall_s - self.last_begin_wall_s) / self.scale)


def cadence(job: Job) -> Cadence | None:
    """The job's cadence from its last Training Begins (their events, wall time) and its last updates (their
    TRAIN records, loop time: a Training Begin at `time_s - duration_s - return_latency_s`); None before it has
    trained twice."""
    walls = sorted(
        t.timestamp()
        for t in Event.objects.filter(job=job, kind="training.begin")
        .order_by("-id")
        .values_list("created", flat=True)[:TB_HISTORY]
    )
    recs = [
        TelemetryRecord.from_json(r)
        for r in TelemetrySample.objects.filter(job=job, kind="train")
        .order_by("-id")
        .values_list("record", flat=True)[:TB_HISTORY]
    ]
    loops = sorted(r.time_s - r.duration_s - r.return_latency_s for r in recs)
    n = min(len(walls), len(loops))
    if n < 2:
        return None
    period = statistics.median(b - a for a, b in pairwise(loops[-n:]))
    wall = statistics.median(b - a for a, b in pairwise(walls[-n:]))
    if not period > 0 or not wall > 0:
        return None
    returns = statistics.median(r.return_latency_s for r in recs)
    return Cadence(period, returns, wall / period, walls[-1], statistics.median(r.duration_s for r in recs))


def tps_fit(owner_tp: int, borrower_tp: int) -> bool:
    """A lend between jobs of these TPs moves whole workers of both: one TP divides the other (a TP2 training
    unit holds two TP1 workers; two TP1 units on one node hold a TP2 worker)."""
    a, b = max(1, owner_tp), max(1, borrower_tp)
    return max(a, b) % min(a, b) == 0


def lend_gpus(owner_tp: int, borrower_tp: int) -> int:
    """The GPUs one lend step moves between jobs of these TPs (`core.arbiter.lend_step`, in GPUs): the least
    common multiple of their TPs."""
    return math.lcm(max(1, owner_tp), max(1, borrower_tp))


def lend_refusal(job: Job, jobs: list[Job], *, borrowing: bool, rhythm: Cadence | None) -> str:
    """Why the arbiter may not lend the job's idle training GPUs to the other `jobs` it divides among ("" if it
    may: it then lends where a lend pays, `core.arbiter.lend_saving`): the limits `services.lending` says."""
    if not settings.PEARL["CROSS_JOB_LENDING"]:
        return "cross-job lending is off (the CROSS_JOB_LENDING setting)"
    others = [j for j in jobs if j.pk != job.pk]
    if not others:
        return "no other job shares the cluster"
    if borrowing:
        return "it borrows another job's training GPUs now (a job lends or borrows, never both)"
    apart = [j for j in others if not tps_fit(job.tp, j.tp)]
    if apart:
        names = ", ".join(f"{j.name} (TP {j.tp})" for j in apart)
        return f"its TP {job.tp} and {names} neither divide the other: a lent training unit holds whole workers of both"
    chip = job.hardware.lower()
    refuse = [j.name for j in others if chip not in {h.lower() for h in j.rollout_hardware}]
    if refuse:
        return f"job(s) {', '.join(refuse)} do not roll out on {job.hardware}"
    if rhythm is None:
        return "its next Training Begin cannot be predicted yet (it has trained fewer than twice)"
    return ""


def measured_reload_s(job: Job) -> float | None:
    """How long a new worker of the job takes to serve: the median of its last done START_WORKER steps (one is
    done once its worker runs holding the job's weights); None before any."""
    rows = list(
        TransitionStep.objects.filter(
            transition__job=job, kind=StepKind.START_WORKER, status=TransitionStep.Status.DONE
        )
        .exclude(started=None)
        .exclude(finished=None)
        .order_by("-id")
        .values_list("started", "finished")[:5]
    )
    took = [(f - s).total_seconds() for s, f in rows if s is not None and f is not None]
    return statistics.median(took) if took else None


def lends_of(job_ids: list[int]) -> dict[tuple[int, int], int]:
    """(owner id, borrower id) -> GPUs lent now, among these jobs."""
    return {
        (o, b): g
        for o, b, g in TrainingLend.objects.filter(owner_id__in=job_ids, borrower_id__in=job_ids).values_list(
            "owner_id", "borrower_id", "gpus"
        )
    }


def promised_units(owner: Job) -> int:
    """The owner's units its lends hold (held by a borrower's worker or still to be taken)."""
    return sum(TrainingLend.objects.filter(owner=owner).values_list("gpus", flat=True)) // max(1, owner.tp)


@dataclass(frozen=True, slots=True)
class BorrowedUnit:
    """A lent training unit as the borrower's planner sees it: its worker there (`slot`) or none yet."""

    node_id: int
    gpus: tuple[int, ...]
    hardware: str
    slot: int | None
    leaving: bool  # the lend ended or the owner trains: the worker there goes (its turns resume elsewhere)


def borrowed_units(job: Job) -> tuple[list[BorrowedUnit], int]:
    """The borrower's units on other jobs' training GPUs, and how many its lends allow it now (its planner's cap
    grows by that). Its workers there beyond its lend, or on an owner that trains, leave. Several borrowers of
    one owner take its empty units in borrower id order, so two never pick the same one."""
    lends = dict(TrainingLend.objects.filter(borrower=job).values_list("owner_id", "gpus"))
    mine = WorkerGPU.objects.filter(alive=True, kind="rollout", worker__job=job, gpu__node__pool=Pool.TRAINING)
    owners = set(lends) | set(
        WorkerGPU.objects.filter(alive=True, kind="training", gpu_id__in=mine.values_list("gpu_id", flat=True))
        .exclude(worker__job=job)
        .values_list("worker__job_id", flat=True)
    )
    claimed = claims()
    out: list[BorrowedUnit] = []
    allowed = 0
    for owner in Job.objects.filter(pk__in=owners).order_by("pk"):
        units = training_units(owner, claimed, tp=job.tp)
        room = (
            lends.get(owner.pk, 0) // max(1, job.tp) if not owner.training_active and tps_fit(owner.tp, job.tp) else 0
        )
        n = 0
        for u in units:
            if u.occupant_job == job.pk and u.occupant_slot is not None:
                out.append(BorrowedUnit(u.node_id, u.gpus, owner.hardware, u.occupant_slot, leaving=n >= room))
                n += 1
            elif u.occupant_job == job.pk:  # a start of its own planned there
                n += 1
        allowed += min(n, room)
        # the owner's GPUs the borrowers before it in id order are still to take, empty ones in order
        held = _held_on(owner, claimed)
        ahead = sum(
            max(0, gpus - held.get(b, 0))
            for b, gpus in TrainingLend.objects.filter(owner=owner, borrower_id__lt=job.pk).values_list(
                "borrower_id", "gpus"
            )
        )
        for u in units:
            if u.occupant_job is not None or n >= room:
                continue
            if ahead > 0:
                ahead -= len(u.gpus)
                continue
            out.append(BorrowedUnit(u.node_id, u.gpus, owner.hardware, None, leaving=False))
            n += 1
            allowed += 1
    return out, allowed


def _held_on(owner: Job, claimed: dict[tuple[int, int], int]) -> dict[int, int]:
    """Job id -> the owner's training GPUs its rollout workers hold (or a transition of it is to start one on)."""
    out: dict[int, int] = {}
    for u in training_units(owner, claimed, tp=1):
        if u.occupant_job is not None:
            out[u.occupant_job] = out.get(u.occupant_job, 0) + 1
    return out


def on_owner_gpus(owner: Job) -> list[Worker]:
    """Other jobs' rollout workers on the owner's training GPUs (the lent units' workers)."""
    gpu_ids = WorkerGPU.objects.filter(alive=True, kind="training", worker__job=owner).values_list("gpu_id", flat=True)
    return list(
        Worker.objects.filter(alive=True, bindings__alive=True, bindings__kind="rollout", bindings__gpu_id__in=gpu_ids)
        .exclude(job=owner)
        .select_related("node", "job")
        .distinct()
    )


def leaving_owner_gpus(owner: Job) -> list[Worker]:
    """Other jobs' workers stopped on the owner's training GPUs whose agent still reports them starting or
    shutting down (a lend its owner took back before the worker served: `services.workers.return_borrowed`
    stops it; the agent gives up its start, or retires it if it had just started, and reports it gone). The
    owner's update waits for them as for a parked one: their process may hold the GPUs. Asked only while the
    owner trains (its update is all that waits); an agent that is gone runs nothing (its node is not ready: the
    worker is fenced)."""
    if not owner.training_active:
        return []
    gpus = WorkerGPU.objects.filter(alive=True, kind="training", worker__job=owner)
    running: set[int] = set()
    for observed in Node.objects.filter(
        status=NodeStatus.READY, pk__in=gpus.values_list("gpu__node_id", flat=True)
    ).values_list("observed", flat=True):
        running.update(int(o.get("worker_id", 0)) for o in observed or [] if o.get("state") in ("starting", "draining"))
    if not running:
        return []
    return list(
        Worker.objects.filter(
            pk__in=running,
            alive=False,
            bindings__kind="rollout",
            bindings__gpu_id__in=gpus.values_list("gpu_id", flat=True),
        )
        .exclude(job=owner)
        .select_related("node", "job")
        .distinct()
    )


def taken_back(job: Job, slots: list[int]) -> set[int]:
    """Of these workers of `job`, those on another job's training GPUs whose trainer has begun (Training Begin)."""
    gpus = WorkerGPU.objects.filter(alive=True, kind="training", worker__job__training_active=True).exclude(
        worker__job=job
    )
    return set(
        WorkerGPU.objects.filter(
            alive=True,
            kind="rollout",
            worker__job=job,
            worker__slot__in=slots,
            gpu_id__in=gpus.values_list("gpu_id", flat=True),
        ).values_list("worker__slot", flat=True)
    )


def training_owner(job: Job, groups: list[tuple[int, list[int]]]) -> tuple[Job, int] | None:
    """Another job whose training worker holds any of these (node id, GPU indexes) groups and computes now (it
    took its lent units back; a start there must wait for the next lend), with the group's index. One query."""
    if not groups:
        return None
    where = Q()
    for node_id, indexes in groups:
        where |= Q(gpu__node_id=node_id, gpu__index__in=indexes)
    row = (
        WorkerGPU.objects.filter(where, alive=True, kind="training", worker__job__training_active=True)
        .exclude(worker__job=job)
        .select_related("worker__job", "gpu")
        .first()
    )
    if row is None:
        return None
    at = next(i for i, (n, idx) in enumerate(groups) if n == row.gpu.node_id and row.gpu.index in idx)
    return row.worker.job, at


def lend_followups() -> set[int]:
    """The jobs to plan once a transition ended: a borrower whose lend has room its workers do not fill yet
    (the owner not training), and an owner, lending nothing and not training, one of whose training units has
    no overlap worker (a lend that ended left it empty: its plan starts the overlap worker again)."""
    out: set[int] = set()
    for owner_id, borrower_id, gpus, tp in TrainingLend.objects.filter(owner__training_active=False).values_list(
        "owner_id", "borrower_id", "gpus", "borrower__tp"
    ):
        owner_gpus = WorkerGPU.objects.filter(alive=True, kind="training", worker__job_id=owner_id)
        there = (
            Worker.objects.filter(
                job_id=borrower_id, alive=True, bindings__alive=True, bindings__gpu_id__in=owner_gpus.values("gpu_id")
            )
            .distinct()
            .count()
        )
        if there < gpus // max(1, tp):
            out.add(borrower_id)
    short = (
        Worker.objects.filter(alive=True, zone=Zone.OVERLAP, job__status=Job.Status.RUNNING, job__training_active=False)
        .exclude(job__lends_out__isnull=False)
        .values("job_id")
        .annotate(
            trainers=Count("pk", filter=Q(role=Role.TRAINING)), overlap=Count("pk", filter=~Q(role=Role.TRAINING))
        )
        .filter(overlap__lt=F("trainers"))
        .values_list("job_id", flat=True)
    )
    return out | set(short)
