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
from django.db.models import F
from django.utils import timezone

from controlplane.core.state import Activity, EngineKind, NodeStatus, Pool, Role, Zone
from controlplane.core.transitions import StepKind
from controlplane.models import Job, Node, Transition, TransitionStep, Worker
from controlplane.selectors.driver import observed, serving
from controlplane.selectors.lending import taken_back, training_owner
from controlplane.services import latency
from controlplane.services.errors import Conflict, NotFound
from controlplane.services.events import emit, push_delta_on_commit
from controlplane.services.invariants import checked_once
from controlplane.services.locks import lock_job, lock_nodes, locked
from controlplane.services.nodes import bump_generations, push_nodes
from controlplane.services.plan_queue import replan_short_jobs, resume_deferred_plans
from controlplane.services.planner import ACTIVE_TRANSITION
from controlplane.services.workers import (
    WorkerChange,
    WorkerStart,
    change_workers,
    start_workers,
    stop_workers,
    take_out,
)

FINALIZE = "finalize"
ADMITTED = "admitted"  # a finalize step's args: the slots it made active, whose serving confirms it
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


def _timeout(job: Job) -> timedelta:
    """How long an issued step may wait for its agent's confirmation; a vLLM job's workers start slowly."""
    seconds = float(settings.PEARL.get("STEP_TIMEOUT_S", 120.0))
    if job.engine == EngineKind.VLLM:
        seconds = max(seconds, float(settings.PEARL.get("VLLM_STEP_TIMEOUT_S", 660.0)))
    return timedelta(seconds=seconds)


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
    if outcome == "done" and tr.plan.get("remove"):
        replan_short_jobs(exclude=tr.job_id)  # units came free: the jobs the arbiter allots them to take them
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


def _ready_steps(steps: list[TransitionStep]) -> list[TransitionStep]:
    """The pending steps that may be issued now: a step waits only for what its meaning needs, never for
    another node's agent. Forced removals and bring-ups go at once; a worker's later step waits for its own
    earlier ones (start -> sync weights, drain -> set role or stop); a tear-down (drain, role change,
    voluntary removal) waits for every bring-up (capacity before tear-down); the finalisation waits for
    all. One pass over the steps (the open phases, overall and per worker slot), not one per step."""
    closed = (TransitionStep.Status.DONE, TransitionStep.Status.SKIPPED)
    phases = [_phase(s) for s in steps]
    lowest = 6  # the lowest phase of an open step
    by_slot: dict[int | None, int] = {}  # worker slot -> the lowest phase of its open steps
    for s, ps in zip(steps, phases, strict=True):
        if s.status not in closed:
            lowest = min(lowest, ps)
            by_slot[s.worker_slot] = min(by_slot.get(s.worker_slot, 6), ps)
    out = []
    for s, phase in zip(steps, phases, strict=True):
        if s.status != TransitionStep.Status.PENDING:
            continue
        if phase <= 1:
            out.append(s)
        elif phase == 5:
            if lowest >= 5:
                out.append(s)
        elif not (phase >= 3 and lowest <= 2) and by_slot.get(s.worker_slot, 6) >= phase:
            out.append(s)
    return out


def _advance(tr: Transition, actor: str) -> str:
    """'done', 'waiting' or 'failed'. Every pass issues each step that is ready (one batch: one desired-state
    message per node, whatever number of its workers the batch touches) and checks every issued step
    against the agents' reports (one query for all): a slow or silent node holds up only its own
    workers' later steps and the finalisation, and its steps are issued again, then fail, on the timeout."""
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
    closed = (TransitionStep.Status.DONE, TransitionStep.Status.SKIPPED)
    first = True  # a pass times steps out once, whatever later steps it issues
    while True:
        batch = _ready_steps(steps)
        if batch:
            try:
                _issue(job, batch, actor)
            except Exception as exc:  # refused by the state machine: stop here, a re-plan starts from the state reached
                return _fail(tr, batch[0], f"{exc}", actor)
        issued = [s for s in steps if s.status == TransitionStep.Status.RUNNING]
        if not issued:
            break
        latest = _latest_workers(job, issued)
        done: list[TransitionStep] = []
        skipped: list[TransitionStep] = []
        late: list[TransitionStep] = []
        now = timezone.now()
        for step in issued:
            w = latest.get(step.worker_slot) if step.worker_slot is not None else None
            if _confirmed(job, step, w):
                done.append(step)
                continue
            leaving = _node_leaving(step, w)
            if leaving:  # what the step waits for cannot happen there: fail now, so the re-plan runs
                return _fail(
                    tr,
                    step,
                    f"node {leaving} is leaving (draining, preemption notice or gone) before "
                    "the agent confirmed the step",
                    actor,
                )
            if _lend_taken_back(step, w):
                skipped.append(step)
                continue
            if first and step.started is not None and now - step.started > _timeout(job):
                if step.attempts >= MAX_ATTEMPTS:
                    return _fail(
                        tr,
                        step,
                        f"not confirmed by the agent within {_timeout(job).total_seconds():.0f} s "
                        f"({step.attempts} attempts)",
                        actor,
                    )
                late.append(step)
        if late:
            _reissue(job, late, latest)
        first = False
        if skipped:
            TransitionStep.objects.filter(pk__in=[s.pk for s in skipped]).update(
                status=TransitionStep.Status.SKIPPED, finished=now
            )
            for step in skipped:
                step.status = TransitionStep.Status.SKIPPED
        if not done and not skipped:
            break
        TransitionStep.objects.filter(pk__in=[s.pk for s in done]).update(
            status=TransitionStep.Status.DONE, finished=now
        )
        for step in done:
            step.status = TransitionStep.Status.DONE
            if step.started is not None:
                latency.TRANSITION_STEP_SECONDS.labels(kind=step.kind).observe(
                    max(0.0, (now - step.started).total_seconds())
                )
        # what was confirmed may let later steps go in this same pass
    if all(s.status in closed for s in steps):
        return "done"
    return "waiting"


def _latest_workers(job: Job, steps: list[TransitionStep]) -> dict[int, Worker]:
    """Each step's worker (its slot's newest row, alive or stopped) with its node, in two queries: the
    workers, then their nodes (each node's report is read and decoded once, not once per worker)."""
    slots = {s.worker_slot for s in steps if s.worker_slot is not None}
    latest: dict[int, Worker] = {}
    if slots:
        for w in (
            Worker.objects.filter(job=job, slot__in=slots)
            .only("id", "slot", "node_id", "alive")
            .order_by("slot", "-id")
        ):
            latest.setdefault(w.slot, w)
        nodes = Node.objects.only("id", "name", "status", "pool", "observed").in_bulk(
            {w.node_id for w in latest.values()}
        )
        for w in latest.values():
            w.node = nodes[w.node_id]
    return latest


def _issue(job: Job, steps: list[TransitionStep], actor: str) -> None:
    """Write the desired state of a batch of steps in one transaction (idempotent: a step already
    reflected is a no-op): the bring-ups in one `start_workers`, the removals in one `stop_workers`, the
    role and activity changes in one `change_workers` each, so each node gets one new generation. The
    invariants are checked once for the whole batch, before it commits (`checked_once`), not once per
    service call: each check reads every worker of the job."""
    with transaction.atomic():
        lock_job(job.pk)
        slots = [s.worker_slot for s in steps if s.worker_slot is not None]
        alive = {w.slot: w for w in Worker.objects.filter(job=job, slot__in=slots, alive=True)}
        # the lock order (job -> nodes -> workers): every node the batch touches, at once, in id order
        held = lock_nodes([w.node_id for w in alive.values()] + [s.args["node"] for s in steps if "node" in s.args])
        starts: list[WorkerStart] = []
        out: list[WorkerChange] = []  # out of service: drains, deactivations
        roles: list[WorkerChange] = []  # role changes and activations
        stops: list[int] = []
        lend = False
        finalize: TransitionStep | None = None
        for step in steps:
            w = alive.get(step.worker_slot) if step.worker_slot is not None else None
            role = step.args.get("role")
            if step.kind == StepKind.START_WORKER:
                if w is None:
                    starts.append(
                        WorkerStart(
                            step.args["node"], step.args["gpus"], role, Activity.TRANSITIONING, step.worker_slot
                        )
                    )
            elif step.kind == StepKind.DRAIN and w and w.activity == Activity.ACTIVE:
                out.append(WorkerChange(w.slot, activity=Activity.TRANSITIONING))
            elif step.kind == StepKind.SET_ROLE and w and w.role != role:
                roles.append(WorkerChange(w.slot, role=role, activity=Activity.TRANSITIONING))
            elif step.kind == StepKind.STOP_WORKER and w:
                stops.append(w.slot)
            elif step.kind == StepKind.DEACTIVATE_OVERLAP and w and w.activity != Activity.INACTIVE:
                out.append(WorkerChange(w.slot, activity=Activity.INACTIVE))
            elif step.kind == StepKind.ACTIVATE_OVERLAP and w and (w.role != role or w.activity == Activity.INACTIVE):
                lend = True
                roles.append(WorkerChange(w.slot, role=role, activity=Activity.TRANSITIONING))
            elif step.kind == FINALIZE:
                finalize = step
        admitted: list[int] = []

        def write() -> None:
            nonlocal admitted
            if stops:
                stop_workers(job_id=job.pk, slots=stops, actor=actor)
            if out:
                change_workers(job_id=job.pk, changes=out, actor=actor)
            # a lent training GPU whose owner began training meanwhile is its owner's again
            on_training = [st for st in starts if st.node_id in held and held[st.node_id].pool == Pool.TRAINING]
            back = training_owner(job, [(st.node_id, st.gpu_indexes) for st in on_training])
            if back is not None:
                raise Conflict(
                    f"job {back[0].name}'s Training Begin arrived before worker {on_training[back[1]].slot} started "
                    "on its lent training GPUs: they stay with its trainer and the job is re-planned"
                )
            if starts:
                start_workers(job_id=job.pk, starts=starts, actor=actor)
            if lend and lock_job(job.pk).training_active:  # Training Begin came meanwhile: lend nothing
                raise Conflict(
                    "Training Begin arrived before the borrowed workers were lent: they stay with the trainer"
                )
            if roles:
                change_workers(job_id=job.pk, changes=roles, actor=actor)
            if finalize is not None:
                admitted = _finalize(job, finalize.args["result"], actor)

        if stops or out:  # what is left serving may not be a valid configuration: take_out pauses it then
            take_out(job.pk, actor, write)
        else:
            with checked_once():
                write()
        now = timezone.now()
        TransitionStep.objects.filter(pk__in=[s.pk for s in steps]).update(
            status=TransitionStep.Status.RUNNING, started=now, attempts=F("attempts") + 1
        )
        if finalize is not None:  # its confirmation waits for these workers only (their nodes' reports)
            finalize.args = {**finalize.args, ADMITTED: admitted}
            TransitionStep.objects.filter(pk=finalize.pk).update(args=finalize.args)
    for step in steps:
        step.status, step.started, step.attempts = TransitionStep.Status.RUNNING, now, step.attempts + 1


# steps that need their worker up and serving on its node: they cannot complete on a node that is leaving
_NEEDS_NODE = (StepKind.START_WORKER, StepKind.SYNC_WEIGHTS, StepKind.SET_ROLE, StepKind.ACTIVATE_OVERLAP)


def _node_leaving(step: TransitionStep, w: Worker | None) -> str:
    """The name of the step's worker's node if that node is draining (an operator's drain or a
    preemption notice that arrived after the plan) or gone, for a step that needs the worker serving
    there; "" otherwise. Waiting for such a step would hold the job's single-flight re-plan for
    MAX_ATTEMPTS step timeouts while the capacity it counts on leaves."""
    if step.kind not in _NEEDS_NODE or w is None:
        return ""
    if w.node.status not in (NodeStatus.DRAINING, NodeStatus.GONE):
        return ""
    return w.node.name


def _lend_taken_back(step: TransitionStep, w: Worker | None) -> bool:
    """The step's worker was stopped on another job's training GPUs before it served: that job's Training
    Begin took the lent unit back (`workers.return_borrowed`). What the step waits for cannot happen there,
    and nothing is lost: the step is skipped, the finalisation leaves the worker out (it is not alive), and
    the rest of the transition goes on."""
    return (
        step.kind in _NEEDS_NODE
        and w is not None
        and not w.alive
        and w.node.pool == Pool.TRAINING
        and w.node.status == NodeStatus.READY  # a node leaving or gone fails the step (`_node_leaving`)
    )


def _reissue(job: Job, steps: list[TransitionStep], latest: dict[int, Worker]) -> None:
    """The agents have not shown these steps done in time: send their nodes' desired state again (once
    per node)."""
    node_ids: set[int] = set()
    for step in steps:
        if step.kind == FINALIZE:  # every worker it waits for
            node_ids.update(w.node_id for w in _not_serving_yet(job, step.args.get(ADMITTED)))
        elif step.worker_slot is not None:
            w = latest.get(step.worker_slot)
            if w is not None and w.alive:
                node_ids.add(w.node_id)
    now = timezone.now()
    with transaction.atomic():
        held = lock_nodes(node_ids)
        bump_generations(held.values())
        push_nodes(held)
        TransitionStep.objects.filter(pk__in=[s.pk for s in steps]).update(started=now, attempts=F("attempts") + 1)
    for step in steps:
        step.started, step.attempts = now, step.attempts + 1


def _not_serving_yet(job: Job, slots: list[int] | None = None) -> list[Worker]:
    """The job's active rollout workers on ready nodes (of these `slots`: those a finalize admitted; None:
    all) that do not serve yet at the staleness floor. A worker on a node that is leaving (draining, lease
    expired, gone) is not waited for: it cannot come to serve, and taking it out is the next re-plan's
    work, which this transition holds back. One query for the workers and one for their nodes (a node's
    report is read once, not once per worker; only the nodes of `slots` are read)."""
    floor = max(0, job.weight_version - job.max_staleness)
    qs = Worker.objects.filter(job=job, alive=True, activity=Activity.ACTIVE, node__status=NodeStatus.READY)
    if slots is not None:
        if not slots:
            return []
        qs = qs.filter(slot__in=slots)
    workers = list(
        qs.exclude(role=Role.TRAINING).only("id", "slot", "node_id", "role", "activity", "endpoint", "alive")
    )
    nodes = Node.objects.only("id", "status", "observed").in_bulk({w.node_id for w in workers})
    out = []
    for w in workers:
        w.node = nodes[w.node_id]
        if not serving(w, floor):
            out.append(w)
    return out


def _confirmed(job: Job, step: TransitionStep, w: Worker | None) -> bool:
    """Whether the agents' reported state shows the step done (`w`: the newest worker of its slot)."""
    if step.status in (TransitionStep.Status.PENDING,):
        return False
    if step.kind == FINALIZE:  # the workers it admitted serve (a step recorded before ADMITTED: every worker)
        return not _not_serving_yet(job, step.args.get(ADMITTED))
    if w is None:  # no worker has a null slot
        return step.kind in (StepKind.STOP_WORKER, StepKind.DRAIN)
    if w.node.status in (NodeStatus.NOT_READY, NodeStatus.GONE):
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
    """All-or-nothing expansion: stop every worker this transition started and never admitted (one
    `stop_workers` for all of them: one invariant check, one new generation per node)."""
    slots = [
        s
        for s in TransitionStep.objects.filter(transition=tr, kind=StepKind.START_WORKER)
        .exclude(status=TransitionStep.Status.PENDING)
        .values_list("worker_slot", flat=True)
        if s is not None  # a start step always names its slot; no worker has a null one
    ]
    out = sorted(
        Worker.objects.filter(job=tr.job, slot__in=slots, alive=True)
        .exclude(activity=Activity.ACTIVE)
        .values_list("slot", flat=True)
    )
    if out:
        stop_workers(job_id=tr.job.pk, slots=out, actor=actor)
    return out


def _finalize(job: Job, result: dict[str, str], actor: str) -> list[int]:
    """Atomic finalisation: every worker of the target map becomes active at once (role as planned),
    except those on a node that began leaving since the plan: they stay out, for the next re-plan. The
    target map's workers are read in one query. Returns the slots it changed (admitted or re-roled)."""
    training = Job.objects.filter(pk=job.pk, training_active=True).exists()
    live = {
        slot: (role, activity, zone, node_id)
        for slot, role, activity, zone, node_id in Worker.objects.filter(
            job=job, alive=True, slot__in=[int(s) for s in result]
        ).values_list("slot", "role", "activity", "zone", "node_id")
    }
    ready = set(
        Node.objects.filter(pk__in={v[3] for v in live.values()}, status=NodeStatus.READY).values_list("id", flat=True)
    )
    # a worker on a lent training unit whose owner has begun training since the plan stays out, as one on a
    # leaving node does (its owner took the unit back: `services.lending`); the next plan stops it
    back = taken_back(job, list(live))
    changes = []
    for slot, role in result.items():
        w = live.get(int(slot))
        if w is None or w[3] not in ready or int(slot) in back:
            continue
        w_role, w_activity, w_zone, _ = w
        if w_zone == Zone.OVERLAP and training:
            raise Conflict("training began meanwhile; overlap workers must not be activated")
        if w_role != role or w_activity != Activity.ACTIVE:
            changes.append(WorkerChange(int(slot), role=role if w_role != role else None, activity=Activity.ACTIVE))
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
    return sorted(c.slot for c in changes)


__all__ = ["advance", "execute_transition"]
