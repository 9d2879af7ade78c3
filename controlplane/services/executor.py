"""The Elastic Scheduler's executing half: a Transition's ordered, idempotent steps (④).

Each step runs in its own transaction and is skipped if already done, so a killed executor resumes
without double effects.
"""
from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from controlplane.core.state import Activity, Role, Zone
from controlplane.core.transitions import StepKind
from controlplane.models import Job, Transition, TransitionStep, Worker
from controlplane.services.common import locked
from controlplane.services.errors import Conflict, InvariantViolation, NotFound
from controlplane.services.events import emit, push_delta_on_commit
from controlplane.services.planner import ACTIVE_TRANSITION
from controlplane.services.workers import WorkerChange, change_workers, start_worker, stop_worker


def execute_transition(*, transition_id: int, actor: str = "executor") -> Transition:
    """Run the steps in order; each is its own transaction and is skipped if already done."""
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
    try:
        with transaction.atomic():
            change_workers(job_id=job.pk, changes=[WorkerChange(slot, activity=Activity.TRANSITIONING)], actor=actor)
    except InvariantViolation:
        group = list(Worker.objects.filter(job=job, alive=True, activity=Activity.ACTIVE).exclude(role=Role.TRAINING)
                     .values_list("slot", flat=True))
        change_workers(job_id=job.pk, changes=[WorkerChange(s, activity=Activity.TRANSITIONING) for s in group], actor=actor)


def _finalize(job: Job, result: dict[str, str], actor: str) -> None:
    """Atomic finalisation: every worker of the target map becomes active at once (role as planned)."""
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
