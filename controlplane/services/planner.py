"""The Elastic Scheduler's planning half for one job: ① budget → ② decide → ③ plan, persisted.

It reads the durable state into a core `Inventory`, runs core placement (`core.placement.place`,
the same function the simulator runs) with the job's policy, and records the Decision and the
Transition with its ordered, idempotent steps. Executing them is `services.executor`.

A *unit* is a group of `tp` GPU slots on one node. Dedicated units live on ready reserved/elastic
nodes; overlap units are the job's training-GPU groups, where a training worker and an (initially
inactive) overlap rollout worker share the GPUs.
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Any, cast

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from controlplane.core.arbiter import Idle
from controlplane.core.context import Overrides, Signal
from controlplane.core.placement import Inventory, Placement, Unit, place
from controlplane.core.policies import Policy, make_policy
from controlplane.core.profiles import get_hardware, get_profile
from controlplane.core.state import Activity, NodeStatus, Pool, Role, Zone
from controlplane.core.telemetry import TelemetryRecord
from controlplane.core.transitions import StepKind, TransitionPlan, plan_transition
from controlplane.models import (
    GPU,
    Decision,
    Event,
    Job,
    Override,
    TelemetrySample,
    Transition,
    TransitionStep,
    Worker,
    WorkerGPU,
)
from controlplane.selectors import model_dirs
from controlplane.selectors.jobs import SHARE_EVENT
from controlplane.selectors.lending import borrowed_units, claims
from controlplane.services import dispatch, latency
from controlplane.services.errors import InvalidInput, NotFound, ServiceError
from controlplane.services.events import emit, notify_drivers_on_commit, push_delta_on_commit
from controlplane.services.jobs import TERMINAL, fail_job, job_delta
from controlplane.services.lending import restore_overlap
from controlplane.services.locks import lock_job
from controlplane.services.plan_queue import defer_plan
from controlplane.services.retry import retry_transient
from controlplane.services.workers import start_worker

log = logging.getLogger(__name__)

TELEMETRY_WINDOW = 5000
ACTIVE_TRANSITION = (Transition.Status.PENDING, Transition.Status.RUNNING)


def _chip(hardware: str) -> str:
    """A GPU's chip type as core.profiles spells it (the node agent's name, case-insensitive), for `Unit.hardware`."""
    try:
        return get_hardware(hardware).name
    except ValueError:  # a type the profiles do not know: no job accepts it, but its workers may still be listed
        return hardware


def _typed(job: Job) -> bool:
    """Whether the job's units name their chip types: its rollout pool may gather a type other than the one it
    trains on (issue 23). A one-hardware job's units carry "" (`Unit.hardware`: the job's one hardware)."""
    return len({_chip(h) for h in [job.hardware, *job.rollout_hardware]}) > 1


def _claimed(job: Job) -> set[tuple[int, int]]:
    """(node id, GPU index) that another job's unfinished transition is about to start a worker on."""
    return {gpu for gpu, owner in claims().items() if owner != job.pk}


def _free_units(
    tp: int, hardware: list[str], *, typed: bool = True, claimed: set[tuple[int, int]] | None = None
) -> list[Unit]:
    """Free `tp`-GPU groups of the job's accepted chip types on ready reserved/elastic nodes, in stable (node
    name, index) order. A group is one node's GPUs of one type, so it never mixes types; `typed`: each unit
    carries its type (else ""); `claimed` GPUs (`_claimed`) are not free."""
    bound = set(WorkerGPU.objects.filter(alive=True, kind="rollout").values_list("gpu_id", flat=True))
    claimed = claimed or set()
    types = Q()
    for t in hardware:
        types |= Q(hardware__iexact=t)
    groups: dict[tuple[int, str, str], list[int]] = {}
    for gid, node_id, pool, index, chip in (
        GPU.objects.filter(
            types,
            present=True,
            node__status=NodeStatus.READY,
            node__pool__in=[Pool.RESERVED, Pool.ELASTIC],
        )
        .order_by("node__name", "index")
        .values_list("id", "node_id", "node__pool", "index", "hardware")
    ):
        if gid not in bound and (node_id, index) not in claimed:
            groups.setdefault((node_id, pool, _chip(chip)), []).append(index)
    units = []
    for (node_id, pool, chip), idx in groups.items():
        for i in range(0, len(idx) - tp + 1, tp):
            units.append(Unit(("free", node_id, tuple(idx[i : i + tp])), Pool(pool), hardware=chip if typed else ""))
    return units


def ensure_training_workers(job: Job) -> int:
    """First placement: bind the job's training GPUs (training worker + inactive overlap rollout
    worker per unit). Training bindings never change afterwards."""
    have = Worker.objects.filter(job=job, alive=True, role=Role.TRAINING).count()
    want = job.training_gpus // job.tp
    bound = set(WorkerGPU.objects.filter(alive=True, kind="training").values_list("gpu_id", flat=True))
    groups: dict[int, list[int]] = {}
    for gid, node_id, index in (
        GPU.objects.filter(
            present=True, hardware__iexact=job.hardware, node__status=NodeStatus.READY, node__pool=Pool.TRAINING
        )
        .order_by("node__name", "index")
        .values_list("id", "node_id", "index")
    ):
        if gid not in bound:
            groups.setdefault(node_id, []).append(index)
    units = [(n, idx[i : i + job.tp]) for n, idx in groups.items() for i in range(0, len(idx) - job.tp + 1, job.tp)]
    created = 0
    for node_id, gpus in units[: max(0, want - have)]:
        start_worker(
            job_id=job.pk, node_id=node_id, gpu_indexes=list(gpus), role=Role.TRAINING, activity=Activity.INACTIVE
        )
        start_worker(
            job_id=job.pk, node_id=node_id, gpu_indexes=list(gpus), role=Role.COLOCATED, activity=Activity.INACTIVE
        )
        created += 1
    overlap = Worker.objects.filter(job=job, alive=True, zone=Zone.OVERLAP).exclude(role=Role.TRAINING).count()
    if overlap < have:  # a unit it lent to another job (services.lending) is back: its overlap worker again
        restore_overlap(job)
    return created


def job_inventory(job: Job) -> Inventory:
    """The job's units as core placement sees them: its rollout workers (dedicated and overlap) and
    the free GPU groups it could start new workers on."""
    units: list[Unit] = []
    taken: set[int] = set()
    typed = _typed(job)
    rows = (
        Worker.objects.filter(job=job, alive=True)
        .order_by("slot")
        # plain rows, not model instances, and not the nodes' reports (`observed`): 8,192 workers' worth
        .values_list("slot", "role", "zone", "activity", "inflight", "node__status", "node__pool", "node__hardware")
    )
    borrowed, lent_room = borrowed_units(job)
    on_loan = {b.slot: b for b in borrowed if b.slot is not None}
    for slot, role, zone, activity, inflight, status, pool, hardware in rows:
        if role == Role.TRAINING:
            taken.add(slot)
            continue
        if slot in on_loan or (zone == Zone.ROLLOUT and pool == Pool.TRAINING):
            # its worker on another job's training GPUs: a dedicated unit it may have to give up (at once if no
            # lend holds it any more: that job ended, its training GPUs are no one's to lend)
            units.append(
                Unit(
                    ("w", slot),
                    Pool.ELASTIC,
                    slot,
                    Role(role),
                    leaving=slot not in on_loan or on_loan[slot].leaving or status != NodeStatus.READY,
                    busy=activity != Activity.ACTIVE,
                    inflight=inflight,
                    hardware=_chip(hardware) if typed else "",
                )
            )
            continue
        # a dedicated rollout worker is parked only by fencing (its node's lease lapsed: `expiry`); once its node is
        # back it still counts as the job's, in its role, so the plan is empty, and only a transition's finalize
        # activates it again: it is one still to be admitted (busy), or the job would stall on workers that never serve
        fenced = zone == Zone.ROLLOUT and activity == Activity.INACTIVE
        units.append(
            Unit(
                ("w", slot),
                Pool(pool),
                slot,
                Role(role) if (zone == Zone.ROLLOUT or activity != Activity.INACTIVE) else None,
                leaving=status != NodeStatus.READY,
                busy=activity == Activity.TRANSITIONING or fenced,
                inflight=inflight,
                hardware=_chip(hardware) if typed else "",
            )
        )
    units += _free_units(job.tp, job.rollout_hardware, typed=typed, claimed=_claimed(job))
    units += [  # other jobs' idle training GPUs lent to it (services.lending), where it has no worker yet
        Unit(("free", b.node_id, b.gpus), Pool.ELASTIC, hardware=_chip(b.hardware) if typed else "")
        for b in borrowed
        if b.slot is None
    ]
    cap = job.rollout_gpus // job.tp if job.rollout_gpus else None
    if job.allotted_rollout_gpus is not None:  # the cluster arbiter's share (services.arbitration): never beyond
        cap = min(cap if cap is not None else 1 << 30, job.allotted_rollout_gpus // job.tp + lent_room)
    return Inventory(tuple(units), frozenset(taken), cap, job.training_active)


def job_policy(job: Job) -> Policy:
    """The job's policy with its options, its runtime tracker refitted from stored telemetry and
    the state it carried from the last signal."""
    model_dirs.ensure_profile(job.model)  # a model directory's profile, derived from its config.json
    profile = get_profile(job.hardware, job.model, tp=job.tp)
    policy = make_policy(
        job.policy,
        profile=profile,
        batch_size=job.batch_size,
        max_trajectory_tokens=job.max_trajectory_tokens,
        **(job.policy_options or {}),
    )
    samples = (
        TelemetrySample.objects.filter(job=job).order_by("-id").values_list("record", flat=True)[:TELEMETRY_WINDOW]
    )
    for raw in reversed(list(samples)):
        policy.observe(TelemetryRecord.from_json(raw))
    policy.load_state(job.policy_state or {})
    return policy


def job_overrides(job: Job) -> Overrides:
    o = Override.objects.filter(job=job).first()
    if o is None:
        return Overrides()
    ratio = (o.force_n_prefill, o.force_n_decode) if o.force_n_prefill and o.force_n_decode else None
    return Overrides(
        force_mode=o.force_mode or None,
        force_ratio=ratio,
        exact_ratio=o.force_exact,
        freeze=o.freeze,
        borrowing=o.borrowing,
        elasticity=o.elasticity,
    )


def _candidates(decision: Any) -> list[dict[str, Any]]:
    rows = decision.candidates.to_list()
    return [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()} for r in rows]


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def last_division() -> dict[str, Any]:
    """The data of the last division that changed anything (its `arbiter.reallocated` event): each job's GPUs,
    the capacity and, per job allotted nothing, why (`core.arbiter.Idle`); {} before the first."""
    last = Event.objects.filter(kind=SHARE_EVENT).order_by("-id").values_list("data", flat=True).first()
    return last if isinstance(last, dict) else {}


def idle_reason(job: Job) -> Idle:
    """Why the last division allots `job` nothing. Not recorded (no division since, or one before reasons were
    recorded): no capacity, so a job keeps its parked workers until a division says its units went elsewhere."""
    why = (last_division().get("idle") or {}).get(job.name)
    return Idle(why) if why in set(Idle) else Idle.NO_CAPACITY


def plan_job(
    *, job_id: int, signal: str = Signal.PERIODIC, actor: str = "planner", now_s: float | None = None
) -> Transition | None:
    """Run ①–③ for a job; returns the new Transition (executed by `executor.execute_transition`) or None.
    Timed by `latency.PLAN_SECONDS`."""
    with latency.PLAN_SECONDS.labels(signal=latency.signal_label(signal)).time():
        return _plan_job(job_id=job_id, signal=signal, actor=actor, now_s=now_s)


def _plan_job(*, job_id: int, signal: str, actor: str, now_s: float | None) -> Transition | None:
    with transaction.atomic():
        job = lock_job(job_id)
        if job.status in TERMINAL:
            return None
        if Transition.objects.filter(job=job, status__in=ACTIVE_TRANSITION).exists():
            if signal != Signal.PERIODIC:
                defer_plan(job.pk, str(signal))  # one transition at a time: this signal is planned when it ends
            return None
        if job.status == Job.Status.PAUSED:
            return _release_rollout(job, actor)
        ensure_training_workers(job)
        policy = job_policy(job)
        inv = job_inventory(job)
        if signal == Signal.TRAINING_BEGIN:  # what this Training Begin already took back (jobs.set_training_active)
            inv = replace(inv, returned=job.returned_at_training_begin)
            Job.objects.filter(pk=job.pk).update(returned_at_training_begin=0)  # told once (a driver may repeat TB)
        remaining = job.remaining if job.remaining is not None else job.batch_size
        p = place(
            inv,
            policy,
            signal=Signal(signal),
            now_s=timezone.now().timestamp() if now_s is None else now_s,
            batch_size=job.batch_size,
            remaining=remaining,
            overrides=job_overrides(job),
        )
        job.policy_state = policy.state()
        target = p.target
        waiting = _admission(job, p)
        if waiting or job.status_reason:
            job.status_reason = waiting
            job.save(update_fields=["status_reason", "policy_state", "updated"])
            push_delta_on_commit(kind="job", key=str(job.pk), data=job_delta(job))
        if waiting and (
            job.status == Job.Status.PENDING
            or (target.total == 0 and (p.plan.empty or idle_reason(job) is not Idle.ELSEWHERE))
        ):
            # admitted only once it can run: never "running" on nothing; a running job the arbiter allots nothing
            # because other jobs hold the units (Idle.ELSEWHERE: higher-priority guarantees) still gives its
            # workers up, while one that has nothing because no capacity is left (its node's lease lapsed) keeps
            # its fenced workers parked for the node's resync
            return None
        activation_pending = any(u.busy and u.in_service for u in inv.units if not u.overlap)
        last = Decision.objects.filter(job=job).first()
        if (
            signal == Signal.PERIODIC
            and not activation_pending  # its workers wait for a finalize: the periodic re-plan is what heals that
            and last is not None
            and last.budget == p.budget
            and last.borrow == p.borrow
            and (last.mode, last.n_prefill, last.n_decode, last.n_colocated)
            == (target.mode, target.n_prefill, target.n_decode, target.n_colocated)
            and target == p.current
        ):
            job.save(update_fields=["policy_state", "updated"])
            return None  # a periodic re-plan that changes nothing leaves no row behind
        decision = _record_decision(job, signal, p)
        job.mode, job.n_prefill, job.n_decode, job.n_colocated = (
            target.mode,
            target.n_prefill,
            target.n_decode,
            target.n_colocated,
        )
        if job.status == Job.Status.PENDING:
            job.status = Job.Status.RUNNING
        job.save(update_fields=["mode", "n_prefill", "n_decode", "n_colocated", "status", "policy_state", "updated"])
        push_delta_on_commit(kind="job", key=str(job.pk), data=job_delta(job))
        if p.plan.empty and not activation_pending:
            return None
        transition = _record_transition(job, decision, p, actor)
        dispatch.execute_transition_on_commit(transition.pk)
    return transition


def _admission(job: Job, p: Placement) -> str:
    """What the job still waits for before it can run ("" when nothing): its training GPUs bound,
    and at least one rollout worker placed."""
    reasons = []
    want = job.training_gpus // job.tp
    have = Worker.objects.filter(job=job, alive=True, role=Role.TRAINING).count()
    if have < want:
        reasons.append(
            f"waiting for training GPUs: {have * job.tp} of {job.training_gpus} bound (no free {job.tp}-GPU "
            f"{job.hardware} group on a ready training node; add or undrain one)"
        )
    if p.target.total == 0 and job.allotted_rollout_gpus == 0:
        why = idle_reason(job)
        reasons.append(
            "waiting for rollout GPUs: the cluster arbiter allots it 0 "
            + (
                "(higher-priority jobs' guarantees or the other jobs' shares take every unit; its priority, weight "
                "and min_rollout_gpus set its share)"
                if why is Idle.ELSEWHERE
                else f"({why}: no ready reserved or elastic node has a {job.tp}-GPU "
                f"{'/'.join(job.rollout_hardware)} group)"
            )
        )
    elif p.target.total == 0 and job.allotted_rollout_gpus:
        reasons.append(
            f"waiting for rollout GPUs: the cluster arbiter allots it {job.allotted_rollout_gpus}, none free yet "
            "(the jobs that give them up drain their workers first)"
        )
    elif p.target.total == 0:
        reasons.append(
            f"waiting for rollout GPUs: no free {job.tp}-GPU {'/'.join(job.rollout_hardware)} group on a ready "
            "reserved or elastic node "
            f"(other jobs hold them, or none is registered)"
        )
    return "; ".join(reasons)


def plan_job_isolated(*, job_id: int, signal: str = Signal.PERIODIC) -> Transition | None:
    """`plan_job` for the Celery tasks: one job's failure never stops the others. A job that cannot be
    planned at all fails with a reason a person can act on; a conflict with something in progress is
    retried by the next signal or tick. With the planner off (`PEARL_PLANNER=off`) it plans nothing (a transition
    already planned still runs to its end)."""
    if not settings.PEARL["PLANNER"]:
        return None
    try:
        return retry_transient(plan_job, job_id=job_id, signal=signal)
    except NotFound:
        return None
    except (InvalidInput, ValueError) as exc:
        fail_job(job_id=job_id, reason=f"the job cannot be planned: {exc}", actor="planner")
    except ServiceError as exc:
        with transaction.atomic():
            emit(
                kind="plan.deferred",
                job=Job.objects.filter(pk=job_id).first(),
                actor="planner",
                message=f"re-plan of job {job_id} deferred: {exc.message}",
            )
    except Exception as exc:  # a bug: recorded for a person, the other jobs go on
        log.exception("planning job %s failed", job_id)
        with transaction.atomic():
            emit(
                kind="plan.error",
                job=Job.objects.filter(pk=job_id).first(),
                actor="planner",
                message=f"re-plan of job {job_id} failed: {type(exc).__name__}: {exc}"[:2000],
            )
    return None


def _record_decision(job: Job, signal: str, p: Placement) -> Decision:
    d = p.action.decision
    target = p.target
    decision = Decision.objects.create(
        job=job,
        signal=str(signal),
        budget=p.budget,
        profile={k: v for k, v in d.inputs.items() if isinstance(v, (int, float, str, bool, dict, list))},
        candidates=_candidates(d),
        mode=target.mode,
        n_prefill=target.n_prefill,
        n_decode=target.n_decode,
        n_colocated=target.n_colocated,
        borrow=p.borrow,
        predicted_makespan_s=_finite(d.predicted_makespan_s),
        expected_gain=_finite(d.expected_gain) or 0.0,
        admitted=d.admitted,
        reason=d.reason,
    )
    push_delta_on_commit(
        kind="decision",
        key=str(decision.pk),
        data={
            "id": decision.pk,
            "job": job.name,
            "label": target.label(),
            "admitted": decision.admitted,
            "reason": decision.reason,
            "predicted_makespan_s": decision.predicted_makespan_s,
            "borrow": p.borrow,
        },
    )
    notify_drivers_on_commit([job.pk])  # the loop records the prediction against its step
    return decision


def _release_rollout(job: Job, actor: str) -> Transition | None:
    """A paused job holds no rollout unit: each dedicated rollout worker drains (a turn in flight finishes, or
    goes back to the driver with its partial output, which the driver keeps) and stops; each lent overlap
    worker drains and goes back to sleep on its training GPUs. Its training workers (the trainer, its
    checkpoint and step buffer on their node, and the node's rollout driver) stay. The policy is not asked:
    the target is nothing. None when nothing is left to release."""
    current: dict[int, Role] = {}
    overlap: list[int] = []
    load: dict[int, int] = {}
    rows = (
        Worker.objects.filter(job=job, alive=True)
        .exclude(role=Role.TRAINING)
        .values_list("slot", "role", "zone", "activity", "inflight")
    )
    for slot, role, zone, activity, inflight in rows:
        if zone == Zone.OVERLAP:
            if activity == Activity.INACTIVE:
                continue  # asleep on the trainer's GPUs already
            overlap.append(slot)
        current[slot] = Role(role)
        load[slot] = inflight
    if (job.n_prefill, job.n_decode, job.n_colocated) != (0, 0, 0):  # it serves nothing (the page shows 0C)
        job.n_prefill, job.n_decode, job.n_colocated = 0, 0, 0
        job.save(update_fields=["n_prefill", "n_decode", "n_colocated", "updated"])
        push_delta_on_commit(kind="job", key=str(job.pk), data=job_delta(job))
    if not current:
        return None
    plan = plan_transition(current, {}, inflight=load, overlap=overlap)
    transition = Transition.objects.create(
        job=job,
        plan={
            "add": {},
            "remove": list(plan.remove),
            "reassign": {},
            "cost": plan.cost,
            "d_worker": plan.d_worker,
            "d_role": plan.d_role,
            "target": "paused",
            "borrow": 0,
        },
    )
    _store_steps(transition, plan, {})
    emit(
        kind="transition.planned",
        job=job,
        actor=actor,
        message=f"{job.name}: paused, its rollout workers {sorted(current)} released (−{len(plan.remove)})",
        data={"transition": transition.pk, "decision": None},
    )
    dispatch.execute_transition_on_commit(transition.pk)
    return transition


def _store_steps(transition: Transition, plan: TransitionPlan, new_workers: dict[int, Unit]) -> None:
    """The transition's ordered steps, then its finalize step (which admits the plan's result at once)."""
    steps = []
    for i, st in enumerate(plan.steps):
        args: dict[str, Any] = {"role": str(st.role) if st.role else None, "forced": st.forced}
        if st.kind == StepKind.START_WORKER:
            # a new worker starts on a free unit, keyed ("free", node id, GPU indexes) by _free_units
            _, node_id, gpus = cast("tuple[str, int, tuple[int, ...]]", new_workers[st.worker].key)
            args |= {"node": node_id, "gpus": list(gpus)}
        steps.append(
            TransitionStep(transition=transition, index=i, kind=st.kind, worker_slot=st.worker, args=args, key=st.key)
        )
    final = {str(s): str(r) for s, r in plan.result.items()}
    steps.append(
        TransitionStep(
            transition=transition,
            index=len(steps),
            kind="finalize",
            args={"result": final},
            key=f"{plan.plan_id}:finalize",
        )
    )
    TransitionStep.objects.bulk_create(steps)


def _record_transition(job: Job, decision: Decision, p: Placement, actor: str) -> Transition:
    plan = p.plan
    transition = Transition.objects.create(
        job=job,
        decision=decision,
        plan={
            "add": {str(k): str(v) for k, v in plan.add.items()},
            "remove": list(plan.remove),
            "reassign": {str(k): str(v) for k, v in plan.reassign.items()},
            "cost": plan.cost,
            "d_worker": plan.d_worker,
            "d_role": plan.d_role,
            "target": p.target.label(),
            "borrow": p.borrow,
        },
    )
    _store_steps(transition, plan, p.new_workers)
    current = p.current
    emit(
        kind="transition.planned",
        job=job,
        actor=actor,
        message=f"{job.name}: {current.label() if current else 'nothing'} → {p.target.label()} "
        f"(+{len(plan.add)} −{len(plan.remove)} re-role {len(plan.reassign)}; borrow {p.borrow})",
        data={"transition": transition.pk, "decision": decision.pk},
    )
    return transition
