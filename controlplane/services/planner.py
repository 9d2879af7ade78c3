"""The live PEARL loop for one job: ① budget → ② decide (core policy) → ③ plan (minimal-change
transition) → ④ execute (ordered, idempotent steps). The same core policy objects run in the
simulator; here they read the durable state and stored telemetry instead of virtual time.

Placement: a *unit* is a group of `tp` GPU slots on one node. Dedicated units live on ready
reserved/elastic nodes; overlap units are the job's training-GPU groups, where a training worker and
an (initially inactive) overlap rollout worker share the GPUs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from controlplane.core.policies import Overrides, PolicyContext, Signal, make_policy
from controlplane.core.profiles import get_profile
from controlplane.core.state import Activity, Configuration, NodeStatus, Pool, Role, Zone
from controlplane.core.telemetry import TelemetryRecord
from controlplane.core.transitions import StepKind, plan_transition
from controlplane.models import GPU, Decision, Job, Override, TelemetrySample, Transition, TransitionStep, Worker, WorkerGPU
from controlplane.services.common import lock_job, locked
from controlplane.services.errors import Conflict, NotFound
from controlplane.services.events import emit, push_delta_on_commit
from controlplane.services.jobs import TERMINAL, job_delta
from controlplane.services.workers import start_worker

TELEMETRY_WINDOW = 5000
ACTIVE_TRANSITION = (Transition.Status.PENDING, Transition.Status.RUNNING)


@dataclass(frozen=True, slots=True)
class Unit:
    node_id: int
    gpus: tuple[int, ...]  # slot indexes on the node
    pool: str


def _units(pools: list[str], tp: int, exclude_bound_kind: str) -> list[Unit]:
    """Free `tp`-GPU groups on ready nodes of these pools, in stable (node name, index) order."""
    bound = set(WorkerGPU.objects.filter(alive=True, kind=exclude_bound_kind).values_list("gpu_id", flat=True))
    groups: dict[tuple[int, str], list[int]] = {}
    for gid, node_id, pool, index in (
        GPU.objects.filter(present=True, node__status=NodeStatus.READY, node__pool__in=pools)
        .order_by("node__name", "index").values_list("id", "node_id", "node__pool", "index")
    ):
        if gid not in bound:
            groups.setdefault((node_id, pool), []).append(index)
    units = []
    for (node_id, pool), idx in groups.items():
        for i in range(0, len(idx) - tp + 1, tp):
            units.append(Unit(node_id, tuple(idx[i : i + tp]), pool))
    return units


def _free_slots(job: Job, n: int, taken: set[int]) -> list[int]:
    out, s = [], 0
    while len(out) < n:
        if s not in taken:
            out.append(s)
        s += 1
    return out


def ensure_training_workers(job: Job) -> int:
    """First placement: bind the job's training GPUs (training worker + inactive overlap rollout
    worker per unit). Training bindings never change afterwards."""
    have = Worker.objects.filter(job=job, alive=True, role=Role.TRAINING).count()
    want = job.training_gpus // job.tp
    created = 0
    for unit in _units([Pool.TRAINING], job.tp, "training")[: max(0, want - have)]:
        start_worker(job_id=job.pk, node_id=unit.node_id, gpu_indexes=list(unit.gpus), role=Role.TRAINING,
                     activity=Activity.INACTIVE)
        start_worker(job_id=job.pk, node_id=unit.node_id, gpu_indexes=list(unit.gpus), role=Role.COLOCATED,
                     activity=Activity.INACTIVE)
        created += 1
    return created


def _policy(job: Job) -> Any:
    profile = get_profile(job.hardware, job.model, tp=job.tp)
    policy = make_policy(job.policy, profile=profile, batch_size=job.batch_size,
                         max_trajectory_tokens=job.max_trajectory_tokens)
    samples = TelemetrySample.objects.filter(job=job).order_by("-id").values_list("record", flat=True)[:TELEMETRY_WINDOW]
    for raw in reversed(list(samples)):
        policy.observe(TelemetryRecord.from_json(raw))
    return policy


def _overrides(job: Job) -> Overrides:
    o = Override.objects.filter(job=job).first()
    if o is None:
        return Overrides()
    ratio = (o.force_n_prefill, o.force_n_decode) if o.force_n_prefill and o.force_n_decode else None
    return Overrides(force_mode=o.force_mode or None, force_ratio=ratio, exact_ratio=o.force_exact, freeze=o.freeze,
                     borrowing=o.borrowing, elasticity=o.elasticity)


def _candidates(decision: Any) -> list[dict[str, Any]]:
    table = getattr(decision, "candidates", None)
    rows = table.to_list() if hasattr(table, "to_list") else list(table or [])
    clean = []
    for r in rows:
        clean.append({k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()})
    return clean


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def plan_job(*, job_id: int, signal: str = Signal.PERIODIC, actor: str = "planner") -> Transition | None:
    """Run ①–③ for a job; returns the new Transition (executed by `execute_transition`) or None."""
    with transaction.atomic():
        job = lock_job(job_id)
        if job.status in TERMINAL:
            return None
        if Transition.objects.filter(job=job, status__in=ACTIVE_TRANSITION).exists():
            return None  # one transition at a time; the next periodic plan runs after it
        ensure_training_workers(job)
        overrides = _overrides(job)
        workers = list(Worker.objects.filter(job=job, alive=True).exclude(role=Role.TRAINING).select_related("node"))
        dedicated = [w for w in workers if w.zone == Zone.ROLLOUT]
        overlap = [w for w in workers if w.zone == Zone.OVERLAP]
        leaving = [w for w in dedicated if w.node.status != NodeStatus.READY
                   or (not overrides.elasticity and w.node.pool == Pool.ELASTIC)]
        pools = [Pool.RESERVED, Pool.ELASTIC] if overrides.elasticity else [Pool.RESERVED]
        free_units = _units(pools, job.tp, "rollout")
        cap = max(0, job.rollout_gpus // job.tp)
        staying = len(dedicated) - len(leaving)
        new_units = free_units[: max(0, cap - staying)]
        n_dedicated = staying + len(new_units)
        reserved_staying = sum(1 for w in dedicated if w.node.pool == Pool.RESERVED and w not in leaving)
        reserved_new = sum(1 for u in new_units if u.pool == Pool.RESERVED)
        borrowed = [w for w in overlap if w.activity != Activity.INACTIVE]
        ready_overlap = [w for w in overlap if w.node.status == NodeStatus.READY]
        current = _configuration(dedicated + borrowed)
        ctx = PolicyContext(
            now_s=timezone.now().timestamp(), signal=Signal(signal), dedicated_workers=n_dedicated,
            reserved_workers=reserved_staying + reserved_new,
            overlap_workers=0 if job.training_active else len(ready_overlap), training_active=job.training_active,
            current=current, borrowed=len(borrowed), batch_size=job.batch_size, remaining=job.batch_size,
            overrides=overrides,
        )
        action = _policy(job).on_event(ctx)
        d = action.decision
        budget = {"dedicated_workers": n_dedicated, "overlap_workers": ctx.overlap_workers, "borrowed": len(borrowed),
                  "training_active": job.training_active, "leaving": [w.slot for w in leaving]}
        last = Decision.objects.filter(job=job).first()
        if (signal == Signal.PERIODIC and last is not None and last.budget == budget and last.borrow == action.borrow
                and (last.mode, last.n_prefill, last.n_decode, last.n_colocated) == (
                    action.target.mode, action.target.n_prefill, action.target.n_decode, action.target.n_colocated)
                and action.target == current):
            return None  # a periodic re-plan that changes nothing leaves no row behind
        decision = Decision.objects.create(
            job=job, signal=str(signal), budget=budget,
            profile={k: v for k, v in (getattr(d, "inputs", {}) or {}).items() if isinstance(v, (int, float, str, bool, dict, list))},
            candidates=_candidates(d), mode=action.target.mode, n_prefill=action.target.n_prefill,
            n_decode=action.target.n_decode, n_colocated=action.target.n_colocated, borrow=action.borrow,
            predicted_makespan_s=_finite(getattr(d, "predicted_makespan_s", None)),
            expected_gain=_finite(getattr(d, "expected_gain", 0.0)) or 0.0,
            admitted=bool(getattr(d, "admitted", True)), reason=str(getattr(d, "reason", "")),
        )
        push_delta_on_commit(kind="decision", key=str(decision.pk), data={
            "id": decision.pk, "job": job.name, "label": action.target.label(), "admitted": decision.admitted,
            "reason": decision.reason, "predicted_makespan_s": decision.predicted_makespan_s, "borrow": action.borrow})

        # ③ plan: survivors keep their slots; new dedicated units and borrowed overlap workers join.
        current_map = {w.slot: Role(w.role) for w in dedicated + borrowed}
        taken = {w.slot for w in workers} | set(Worker.objects.filter(job=job, alive=True, role=Role.TRAINING).values_list("slot", flat=True))
        new_slots = _free_slots(job, len(new_units), taken)
        to_borrow = [w for w in ready_overlap if w.activity == Activity.INACTIVE][: max(0, action.borrow - len(borrowed))]
        returning = borrowed[action.borrow:] if action.borrow < len(borrowed) else []
        plan = plan_transition(
            current_map, action.target.role_counts(),
            joining=new_slots + [w.slot for w in to_borrow],
            leaving=[w.slot for w in leaving] + [w.slot for w in returning],
            inflight={w.slot: w.inflight for w in workers},
            overlap=[w.slot for w in overlap],
        )
        unit_of = dict(zip(new_slots, new_units))
        job.mode, job.n_prefill, job.n_decode, job.n_colocated = (
            action.target.mode, action.target.n_prefill, action.target.n_decode, action.target.n_colocated)
        if job.status == Job.Status.PENDING:
            job.status = Job.Status.RUNNING
        job.save(update_fields=["mode", "n_prefill", "n_decode", "n_colocated", "status", "updated"])
        push_delta_on_commit(kind="job", key=str(job.pk), data=job_delta(job))
        activation_pending = any(w.activity == Activity.TRANSITIONING for w in dedicated)
        if plan.empty and not activation_pending:
            return None
        transition = Transition.objects.create(
            job=job, decision=decision,
            plan={"add": {str(k): str(v) for k, v in plan.add.items()}, "remove": list(plan.remove),
                  "reassign": {str(k): str(v) for k, v in plan.reassign.items()}, "cost": plan.cost,
                  "d_worker": plan.d_worker, "d_role": plan.d_role, "target": action.target.label(), "borrow": action.borrow},
        )
        steps = []
        for i, st in enumerate(plan.steps):
            args: dict[str, Any] = {"role": str(st.role) if st.role else None, "forced": st.forced}
            if st.kind == StepKind.START_WORKER:
                unit = unit_of[st.worker]
                args |= {"node": unit.node_id, "gpus": list(unit.gpus)}
            steps.append(TransitionStep(transition=transition, index=i, kind=st.kind, worker_slot=st.worker, args=args, key=st.key))
        final = {str(s): str(r) for s, r in plan.result.items()}
        steps.append(TransitionStep(transition=transition, index=len(steps), kind="finalize", args={"result": final},
                                    key=f"{plan.plan_id}:finalize"))
        TransitionStep.objects.bulk_create(steps)
        emit(kind="transition.planned", job=job, actor=actor,
             message=f"{job.name}: {current.label() if current else 'nothing'} → {action.target.label()} "
                     f"(+{len(plan.add)} −{len(plan.remove)} re-role {len(plan.reassign)}; borrow {action.borrow})",
             data={"transition": transition.pk, "decision": decision.pk})
        from controlplane import tasks

        transaction.on_commit(lambda: tasks.execute_transition.delay(transition.pk), robust=True)
    return transition


def _configuration(workers: list[Worker]) -> Configuration | None:
    roles = [Role(w.role) for w in workers]
    if not roles:
        return None
    if Role.COLOCATED in roles:
        return Configuration.colocated(len(roles))
    p, d = roles.count(Role.PREFILL), roles.count(Role.DECODE)
    return Configuration.disaggregated(p, d) if p and d else None


def execute_transition(*, transition_id: int, actor: str = "executor") -> Transition:
    """Run the steps in order; each is its own transaction and is skipped if already done, so a
    killed executor resumes without double effects."""
    from controlplane.services.workers import WorkerChange, change_workers, stop_worker

    with transaction.atomic():
        tr = locked(Transition.objects.filter(pk=transition_id)).select_related("job").first()
        if tr is None:
            raise NotFound(f"transition {transition_id} does not exist")
        if tr.status not in ACTIVE_TRANSITION:
            return tr
        if tr.status == Transition.Status.PENDING:
            tr.status, tr.started = Transition.Status.RUNNING, timezone.now()
            tr.save(update_fields=["status", "started"])
    job = tr.job
    for step_id in TransitionStep.objects.filter(transition=tr).order_by("index").values_list("id", flat=True):
        with transaction.atomic():
            step = locked(TransitionStep.objects.filter(pk=step_id)).first()
            if step is None or step.status in (TransitionStep.Status.DONE, TransitionStep.Status.SKIPPED):
                continue
            step.status, step.attempts, step.started = TransitionStep.Status.RUNNING, step.attempts + 1, timezone.now()
            step.save(update_fields=["status", "attempts", "started"])
        try:
            with transaction.atomic():
                alive = Worker.objects.filter(job=job, slot=step.worker_slot, alive=True).first() if step.worker_slot is not None else None
                role = step.args.get("role")
                if step.kind == StepKind.START_WORKER:
                    if alive is None:
                        start_worker(job_id=job.pk, node_id=step.args["node"], gpu_indexes=step.args["gpus"], role=role,
                                     activity=Activity.TRANSITIONING, slot=step.worker_slot, actor=actor)
                elif step.kind in (StepKind.DRAIN,) and alive and alive.activity == Activity.ACTIVE:
                    _drain(job, step.worker_slot, actor)
                elif step.kind == StepKind.SET_ROLE and alive and alive.role != role:
                    change_workers(job_id=job.pk, changes=[WorkerChange(step.worker_slot, role=role, activity=Activity.TRANSITIONING)], actor=actor)
                elif step.kind == StepKind.STOP_WORKER and alive:
                    stop_worker(job_id=job.pk, slot=step.worker_slot, actor=actor)
                elif step.kind == StepKind.DEACTIVATE_OVERLAP and alive and alive.activity != Activity.INACTIVE:
                    change_workers(job_id=job.pk, changes=[WorkerChange(step.worker_slot, activity=Activity.INACTIVE)], actor=actor)
                elif step.kind == StepKind.ACTIVATE_OVERLAP and alive and (alive.role != role or alive.activity == Activity.INACTIVE):
                    change_workers(job_id=job.pk, changes=[WorkerChange(step.worker_slot, role=role, activity=Activity.TRANSITIONING)], actor=actor)
                elif step.kind == "finalize":
                    _finalize(job, step.args["result"], actor)
                TransitionStep.objects.filter(pk=step.pk).update(status=TransitionStep.Status.DONE, finished=timezone.now())
        except Exception as exc:  # record and stop here; a later re-plan starts from the state reached
            TransitionStep.objects.filter(pk=step.pk).update(status=TransitionStep.Status.FAILED, finished=timezone.now(), error=str(exc)[:2000])
            Transition.objects.filter(pk=tr.pk).update(status=Transition.Status.FAILED, finished=timezone.now(), error=str(exc)[:2000])
            with transaction.atomic():
                emit(kind="transition.failed", job=job, actor=actor, message=f"{job.name}: transition {tr.pk} failed at step {step.index} ({step.kind}): {exc}")
            tr.refresh_from_db()
            return tr
    with transaction.atomic():
        Transition.objects.filter(pk=tr.pk).update(status=Transition.Status.SUCCEEDED, finished=timezone.now())
        emit(kind="transition.succeeded", job=job, actor=actor, message=f"{job.name}: transition {tr.pk} applied ({tr.plan.get('target')})",
             data={"transition": tr.pk})
        push_delta_on_commit(kind="transition", key=str(tr.pk), data={"id": tr.pk, "job": job.name, "status": "succeeded"})
    tr.refresh_from_db()
    return tr


def _drain(job: Job, slot: int, actor: str) -> None:
    """Drain one worker; if the survivors would no longer form a valid configuration (a mode switch
    taking the last prefill or decode worker), drain the whole old group together: admission pauses
    until the finalize step admits the new group at once."""
    from controlplane.services.errors import InvariantViolation
    from controlplane.services.workers import WorkerChange, change_workers

    try:
        with transaction.atomic():
            change_workers(job_id=job.pk, changes=[WorkerChange(slot, activity=Activity.TRANSITIONING)], actor=actor)
    except InvariantViolation:
        group = list(Worker.objects.filter(job=job, alive=True, activity=Activity.ACTIVE).exclude(role=Role.TRAINING)
                     .values_list("slot", flat=True))
        change_workers(job_id=job.pk, changes=[WorkerChange(s, activity=Activity.TRANSITIONING) for s in group], actor=actor)


def _finalize(job: Job, result: dict[str, str], actor: str) -> None:
    """Atomic finalisation: every worker of the target map becomes active at once (role as planned)."""
    from controlplane.services.workers import WorkerChange, change_workers

    changes = []
    for slot, role in result.items():
        w = Worker.objects.filter(job=job, slot=int(slot), alive=True).first()
        if w is not None and w.zone == Zone.OVERLAP and Job.objects.filter(pk=job.pk, training_active=True).exists():
            raise Conflict("training began meanwhile; overlap workers must not be activated")
        if w is not None and (w.role != role or w.activity != Activity.ACTIVE):
            changes.append(WorkerChange(int(slot), role=role if w.role != role else None, activity=Activity.ACTIVE))
    if changes:
        # roles first (workers are not active yet), then admit the whole group together
        role_changes = [WorkerChange(c.slot, role=c.role) for c in changes if c.role]
        if role_changes:
            change_workers(job_id=job.pk, changes=[WorkerChange(c.slot, role=c.role, activity=Activity.TRANSITIONING) for c in role_changes], actor=actor)
        change_workers(job_id=job.pk, changes=[WorkerChange(c.slot, activity=Activity.ACTIVE) for c in changes], actor=actor)
