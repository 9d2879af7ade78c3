"""The Elastic Scheduler's executing half (④): a Transition's ordered steps, done when the agents'
observed state shows them done.

A step is *issued* by writing the desired state (start a worker, drain it, change its role, stop it,
activate or deactivate an overlap worker) — the node agents reconcile to it — and *done* once the
agent's heartbeat reports the result: the worker running with its role and weights, drained, asleep,
gone. Steps run in phases (forced removals; bring-ups; weight syncs; drains; role changes and
voluntary removals; the atomic finalisation), all steps of a phase at once. A step not confirmed in
time is issued again, then fails the transition; a failed bring-up rolls back every worker this
transition started (all-or-nothing expansion). Progress lives in the database and a lease keeps two
executors off one transition, so a killed Celery worker's transition resumes where it was.
"""

from __future__ import annotations

import secrets
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.core.state import Activity, NodeStatus, Role, Zone
from controlplane.core.transitions import StepKind
from controlplane.models import Job, Transition, TransitionStep, Worker
from controlplane.selectors.driver import observed, serving
from controlplane.services import latency
from controlplane.services.errors import Conflict, NotFound
from controlplane.services.events import emit, push_delta_on_commit
from controlplane.services.locks import lock_job, lock_nodes, locked
from controlplane.services.nodes import bump_generation, push_node
from controlplane.services.plan_queue import resume_deferred_plans
from controlplane.services.planner import ACTIVE_TRANSITION
from controlplane.services.workers import WorkerChange, change_workers, start_worker, stop_worker, take_out

FINALIZE = "finalize"
MAX_ATTEMPTS = 3


def _phase(step: TransitionStep) -> int:
    kind, forced = step.kind, bool(step.args.get("forced"))
    if kind in (StepKind.STOP_WORKER, StepKind.DEACTIVATE_OVERLAP) and forced:
        return 0
    return {
        StepKind.START_WORKER: 1,
        StepKind.ACTIVATE_OVERLAP: 1,
        StepKind.SYNC_WEIGHTS: 2,
        StepKind.DRAIN: 3,
        StepKind.SET_ROLE: 4,
        StepKind.STOP_WORKER: 4,
        StepKind.DEACTIVATE_OVERLAP: 4,
        FINALIZE: 5,
    }[kind]


def _timeout() -> timedelta:
    return timedelta(seconds=float(settings.PEARL.get("STEP_TIMEOUT_S", 120.0)))


LEASE_S = 5.0  # an executor waiting on agents renews its lease on every pass (every fraction of a second)


def execute_transition(*, transition_id: int, actor: str = "executor") -> Transition:
    """Advance the transition as far as the observed state allows. Returns it: RUNNING while it
    waits for agents (call again), SUCCEEDED or FAILED at the end."""
    tr, outcome = advance(transition_id=transition_id, actor=actor)
    if outcome == "waiting":  # a one-off call does not keep the lease: anyone may continue
        Transition.objects.filter(pk=tr.pk).update(lease_owner="", lease_until=None)
    return tr


def advance(*, transition_id: int, owner: str = "", actor: str = "executor") -> tuple[Transition, str]:
    """Like `execute_transition`, with what happened: 'waiting' (call again soon, with the same
    `owner`: the lease is kept for LEASE_S), 'busy' (another executor holds the lease), 'done',
    'failed' or 'ended' (nothing to do). Returns the owner token as `tr.lease_owner` while waiting."""
    owner = owner or secrets.token_hex(8)
    now = timezone.now()
    with transaction.atomic():
        tr = locked(Transition.objects.filter(pk=transition_id)).select_related("job").first()
        if tr is None:
            raise NotFound(f"transition {transition_id} does not exist")
        if tr.status not in ACTIVE_TRANSITION:
            return tr, "ended"
        if tr.lease_until is not None and tr.lease_until > now and tr.lease_owner and tr.lease_owner != owner:
            return tr, "busy"  # another executor is on it
        tr.lease_owner, tr.lease_until = owner, now + timedelta(seconds=30)
        if tr.status == Transition.Status.PENDING:
            tr.status, tr.started = Transition.Status.RUNNING, now
        tr.save(update_fields=["status", "started", "lease_owner", "lease_until"])
    outcome = "failed"
    try:
        outcome = _advance(tr, actor)
    finally:
        if outcome == "waiting":
            Transition.objects.filter(pk=tr.pk, lease_owner=owner).update(
                lease_until=timezone.now() + timedelta(seconds=LEASE_S)
            )
        else:
            Transition.objects.filter(pk=tr.pk, lease_owner=owner).update(lease_owner="", lease_until=None)
    if outcome in ("done", "failed"):
        resume_deferred_plans(tr.job_id)
    if outcome == "done":
        with transaction.atomic():
            Transition.objects.filter(pk=tr.pk).update(status=Transition.Status.SUCCEEDED, finished=timezone.now())
            emit(
                kind="transition.succeeded",
                job=tr.job,
                actor=actor,
                message=f"{tr.job.name}: transition {tr.pk} applied ({tr.plan.get('target')})",
                data={"transition": tr.pk},
            )
            push_delta_on_commit(
                kind="transition", key=str(tr.pk), data={"id": tr.pk, "job": tr.job.name, "status": "succeeded"}
            )
    tr.refresh_from_db()
    return tr, outcome


def _advance(tr: Transition, actor: str) -> str:
    """'done', 'waiting' or 'failed'."""
    job = tr.job
    steps = list(TransitionStep.objects.filter(transition=tr).order_by("index"))
    # A transition that lends overlap workers and has not admitted them yet cannot finish once Training
    # Begin has come (its finalize refuses them); waiting for its other steps would only hold the Training
    # Begin plan, and with it the return deadline, behind this job's single-flight re-plan: end it now.
    lending = [s for s in steps if s.kind == StepKind.ACTIVATE_OVERLAP]
    admitted = any(s.kind == FINALIZE and s.status != TransitionStep.Status.PENDING for s in steps)
    if lending and not admitted and job.training_active:
        return _fail(
            tr,
            lending[0],
            "Training Begin arrived before the borrowed workers were admitted: they stay "
            "with the trainer and the job is re-planned",
            actor,
        )
    for phase in sorted({_phase(s) for s in steps}):
        group = [
            s
            for s in steps
            if _phase(s) == phase and s.status not in (TransitionStep.Status.DONE, TransitionStep.Status.SKIPPED)
        ]
        for step in group:
            if step.status == TransitionStep.Status.PENDING:
                try:
                    _issue(job, step, actor)
                except (
                    Exception
                ) as exc:  # refused by the state machine: stop here, a re-plan starts from the state reached
                    return _fail(tr, step, f"{exc}", actor)
        waiting = False
        for step in group:
            step.refresh_from_db()
            if _confirmed(job, step):
                finished = timezone.now()
                TransitionStep.objects.filter(pk=step.pk).update(status=TransitionStep.Status.DONE, finished=finished)
                if step.started is not None:
                    latency.TRANSITION_STEP_SECONDS.labels(kind=step.kind).observe(
                        max(0.0, (finished - step.started).total_seconds())
                    )
                continue
            waiting = True
            leaving = _node_leaving(job, step)
            if leaving:  # what the step waits for cannot happen there: fail now, so the re-plan runs
                return _fail(
                    tr,
                    step,
                    f"node {leaving} is leaving (draining, preemption notice or gone) before "
                    "the agent confirmed the step",
                    actor,
                )
            if step.started is not None and timezone.now() - step.started > _timeout():
                if step.attempts >= MAX_ATTEMPTS:
                    return _fail(
                        tr,
                        step,
                        f"not confirmed by the agent within {_timeout().total_seconds():.0f} s "
                        f"({step.attempts} attempts)",
                        actor,
                    )
                _reissue(job, step)
        if waiting:
            return "waiting"
    return "done"


def _issue(job: Job, step: TransitionStep, actor: str) -> None:
    """Write the desired state of one step (idempotent: a step already reflected is a no-op)."""
    with transaction.atomic():
        alive = (
            Worker.objects.filter(job=job, slot=step.worker_slot, alive=True).first()
            if step.worker_slot is not None
            else None
        )
        role = step.args.get("role")
        if step.kind == StepKind.START_WORKER:
            if alive is None:
                start_worker(
                    job_id=job.pk,
                    node_id=step.args["node"],
                    gpu_indexes=step.args["gpus"],
                    role=role,
                    activity=Activity.TRANSITIONING,
                    slot=step.worker_slot,
                    actor=actor,
                )
        elif step.kind == StepKind.DRAIN and alive and alive.activity == Activity.ACTIVE:
            take_out(
                job.pk,
                actor,
                lambda: change_workers(
                    job_id=job.pk,
                    changes=[WorkerChange(alive.slot, activity=Activity.TRANSITIONING)],
                    actor=actor,
                ),
            )
        elif step.kind == StepKind.SET_ROLE and alive and alive.role != role:
            change_workers(
                job_id=job.pk,
                changes=[WorkerChange(alive.slot, role=role, activity=Activity.TRANSITIONING)],
                actor=actor,
            )
        elif step.kind == StepKind.STOP_WORKER and alive:
            take_out(job.pk, actor, lambda: stop_worker(job_id=job.pk, slot=alive.slot, actor=actor))
        elif step.kind == StepKind.DEACTIVATE_OVERLAP and alive and alive.activity != Activity.INACTIVE:
            take_out(
                job.pk,
                actor,
                lambda: change_workers(
                    job_id=job.pk, changes=[WorkerChange(alive.slot, activity=Activity.INACTIVE)], actor=actor
                ),
            )
        elif (
            step.kind == StepKind.ACTIVATE_OVERLAP
            and alive
            and (alive.role != role or alive.activity == Activity.INACTIVE)
        ):
            if lock_job(job.pk).training_active:  # Training Begin came meanwhile: lend nothing (it returned them)
                raise Conflict(
                    "Training Begin arrived before the borrowed workers were lent: they stay with the trainer"
                )
            change_workers(
                job_id=job.pk,
                changes=[WorkerChange(alive.slot, role=role, activity=Activity.TRANSITIONING)],
                actor=actor,
            )
        elif step.kind == FINALIZE:
            _finalize(job, step.args["result"], actor)
        TransitionStep.objects.filter(pk=step.pk).update(
            status=TransitionStep.Status.RUNNING, started=timezone.now(), attempts=step.attempts + 1
        )


# steps that need their worker up and serving on its node: they cannot complete on a node that is leaving
_NEEDS_NODE = (StepKind.START_WORKER, StepKind.SYNC_WEIGHTS, StepKind.SET_ROLE, StepKind.ACTIVATE_OVERLAP)


def _node_leaving(job: Job, step: TransitionStep) -> str:
    """The name of the step's worker's node if that node is draining (an operator's drain or a
    preemption notice that arrived after the plan) or gone, for a step that needs the worker serving
    there; "" otherwise. Waiting for such a step would hold the job's single-flight re-plan for
    MAX_ATTEMPTS step timeouts while the capacity it counts on leaves."""
    if step.kind not in _NEEDS_NODE or step.worker_slot is None:
        return ""
    w = Worker.objects.filter(job=job, slot=step.worker_slot).order_by("-id").select_related("node").first()
    if w is None or w.node.status not in (NodeStatus.DRAINING, NodeStatus.GONE):
        return ""
    return w.node.name


def _reissue(job: Job, step: TransitionStep) -> None:
    """The agent has not shown the step done in time: send the desired state again."""
    if step.kind == FINALIZE:  # every worker it waits for
        workers = _not_serving_yet(job)
    else:
        w = (
            Worker.objects.filter(job=job, slot=step.worker_slot, alive=True).select_related("node").first()
            if step.worker_slot is not None
            else None
        )
        workers = [w] if w is not None else []
    with transaction.atomic():
        for node in lock_nodes(w.node_id for w in workers).values():
            bump_generation(node)
            push_node(node.pk)
        TransitionStep.objects.filter(pk=step.pk).update(started=timezone.now(), attempts=step.attempts + 1)


def _not_serving_yet(job: Job) -> list[Worker]:
    """The job's active rollout workers on ready nodes that do not serve yet at the staleness floor. A
    worker on a node that is leaving (draining, lease expired, gone) is not waited for: it cannot come
    to serve, and taking it out is the next re-plan's work, which this transition holds back."""
    floor = max(0, job.weight_version - job.max_staleness)
    return [
        w
        for w in Worker.objects.filter(job=job, alive=True, activity=Activity.ACTIVE, node__status=NodeStatus.READY)
        .exclude(role=Role.TRAINING)
        .select_related("node")
        if not serving(w, floor)
    ]


def _confirmed(job: Job, step: TransitionStep) -> bool:
    """Whether the agents' reported state shows the step done."""
    if step.status in (TransitionStep.Status.PENDING,):
        return False
    if step.kind == FINALIZE:
        return not _not_serving_yet(job)
    stopped = (
        Worker.objects.filter(job=job, slot=step.worker_slot).order_by("-id").select_related("node").first()
        if step.worker_slot is not None
        else None  # no worker has a null slot
    )
    if stopped is None:
        return step.kind in (StepKind.STOP_WORKER, StepKind.DRAIN)
    w, node = stopped, stopped.node
    if node.status in (NodeStatus.NOT_READY, NodeStatus.GONE):
        # its agent is gone (fenced): what needs the worker gone is done, nothing else can be
        return step.kind in (StepKind.STOP_WORKER, StepKind.DEACTIVATE_OVERLAP, StepKind.DRAIN)
    o = observed(w)
    role = step.args.get("role")
    if step.kind == StepKind.STOP_WORKER:
        return not w.alive and (o is None or o.get("state") in ("stopped", "failed"))
    if o is None:
        return False
    if step.kind == StepKind.START_WORKER:
        return o.get("state") == "running" and o.get("role") == role  # running = holding weights the job allows
    if step.kind == StepKind.SYNC_WEIGHTS:
        return o.get("state") == "running" and o.get("weight_version", 0) >= max(
            0, job.weight_version - job.max_staleness
        )
    if step.kind == StepKind.DRAIN:
        return o.get("inflight", 0) == 0
    if step.kind in (StepKind.SET_ROLE, StepKind.ACTIVATE_OVERLAP):
        return o.get("role") == role
    if step.kind == StepKind.DEACTIVATE_OVERLAP:
        return o.get("activity") == Activity.INACTIVE and o.get("inflight", 0) == 0
    return True


def _fail(tr: Transition, step: TransitionStep, why: str, actor: str) -> str:
    job = tr.job
    now = timezone.now()
    TransitionStep.objects.filter(pk=step.pk).update(
        status=TransitionStep.Status.FAILED, finished=now, error=why[:2000]
    )
    rolled_back = _rollback(tr, actor) if _phase(step) <= 2 else []
    Transition.objects.filter(pk=tr.pk).update(status=Transition.Status.FAILED, finished=now, error=why[:2000])
    with transaction.atomic():
        emit(
            kind="transition.failed",
            job=job,
            actor=actor,
            message=f"{job.name}: transition {tr.pk} failed at step {step.index} ({step.kind}): {why}"
            + (f"; rolled back the workers it started: {rolled_back}" if rolled_back else ""),
            data={"transition": tr.pk, "step": step.index, "rolled_back": rolled_back},
        )
    return "failed"


def _rollback(tr: Transition, actor: str) -> list[int]:
    """All-or-nothing expansion: stop every worker this transition started and never admitted."""
    slots = [
        s
        for s in TransitionStep.objects.filter(transition=tr, kind=StepKind.START_WORKER)
        .exclude(status=TransitionStep.Status.PENDING)
        .values_list("worker_slot", flat=True)
        if s is not None  # a start step always names its slot; no worker has a null one
    ]
    out = []
    for slot in slots:
        w = Worker.objects.filter(job=tr.job, slot=slot, alive=True).first()
        if w is not None and w.activity != Activity.ACTIVE:
            stop_worker(job_id=tr.job.pk, slot=slot, actor=actor)
            out.append(slot)
    return out


def _finalize(job: Job, result: dict[str, str], actor: str) -> None:
    """Atomic finalisation: every worker of the target map becomes active at once (role as planned),
    except those on a node that began leaving since the plan: they stay out, for the next re-plan."""
    changes = []
    for slot, role in result.items():
        w = Worker.objects.filter(job=job, slot=int(slot), alive=True).select_related("node").first()
        if w is not None and w.node.status != NodeStatus.READY:
            continue
        if w is not None and w.zone == Zone.OVERLAP and Job.objects.filter(pk=job.pk, training_active=True).exists():
            raise Conflict("training began meanwhile; overlap workers must not be activated")
        if w is not None and (w.role != role or w.activity != Activity.ACTIVE):
            changes.append(WorkerChange(int(slot), role=role if w.role != role else None, activity=Activity.ACTIVE))
    if changes:
        # roles first (workers are not active yet), then admit the whole group together
        role_changes = [WorkerChange(c.slot, role=c.role) for c in changes if c.role]
        if role_changes:
            change_workers(
                job_id=job.pk,
                changes=[WorkerChange(c.slot, role=c.role, activity=Activity.TRANSITIONING) for c in role_changes],
                actor=actor,
            )
        change_workers(
            job_id=job.pk, changes=[WorkerChange(c.slot, activity=Activity.ACTIVE) for c in changes], actor=actor
        )


__all__ = ["advance", "execute_transition"]
