"""What the control plane (the Elastic Scheduler) learns from a job's rollout loop (the Pipeline
Scheduler): progress (step, R), its elastic signals, and the loop's checkpoint.

The loop runs in the job's rollout driver (`core.loop.RolloutLoop` on asyncio); these use cases are
its only ways to change control-plane state. R feeds the Eq. 7 gate of every later plan.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import transaction

from controlplane.core.context import Signal
from controlplane.core.driver_link import TelemetryReport
from controlplane.core.loop import LoopConfig, RolloutLoop
from controlplane.models import Job
from controlplane.services import telemetry
from controlplane.services.errors import Conflict, InvalidInput
from controlplane.services.events import push_delta_on_commit
from controlplane.services.jobs import job_delta, set_training_active
from controlplane.services.locks import lock_job
from controlplane.services.plan_queue import enqueue_plan
from controlplane.services.principals import job_principal

MAX_CHECKPOINT_BYTES = 8 << 20


def loop_config(job: Job) -> LoopConfig:
    """The loop's parameters for this job (the driver builds its RolloutLoop from them)."""
    return LoopConfig(
        batch_size=job.batch_size,
        group_size=job.group_size,
        max_staleness=job.max_staleness,
        return_deadline_s=float(settings.PEARL["RETURN_DEADLINE_S"]),
        periodic_s=None,
        job=job.name,
    )


def report_progress(*, job_id: int, step: int, remaining: int) -> Job:
    """R changed: `remaining` of the step's trajectories are unfinished (a restarted driver may repeat
    the current step; an older step is refused)."""
    with transaction.atomic():
        job = lock_job(job_id, live="it takes no progress reports")
        if not 0 <= remaining <= job.batch_size:
            raise InvalidInput(f"remaining must be within 0..{job.batch_size}", field="remaining")
        if step < job.step:
            raise Conflict(f"job {job.name} is at step {job.step}; a report for step {step} is stale", field="step")
        job.step, job.remaining = step, remaining
        job.save(update_fields=["step", "remaining", "updated"])
        push_delta_on_commit(kind="job", key=str(job.pk), data=job_delta(job))
    return job


def report_signal(*, job_id: int, signal: str, remaining: int, actor: str) -> None:
    """The loop's elastic signal: Training Begin / Finished change the training state (and re-plan);
    the others re-plan with the reported R."""
    try:
        sig = Signal(signal)
    except ValueError:
        raise InvalidInput(
            f"unknown signal {signal!r}; expected one of {[s.value for s in Signal]}", field="signal"
        ) from None
    with transaction.atomic():
        job = lock_job(job_id, live="it takes no signals")
        if not 0 <= remaining <= job.batch_size:
            raise InvalidInput(f"remaining must be within 0..{job.batch_size}", field="remaining")
        job.remaining = remaining
        job.save(update_fields=["remaining", "updated"])
        if sig in (Signal.TRAINING_BEGIN, Signal.TRAINING_FINISHED):
            active = sig is Signal.TRAINING_BEGIN
            if job.training_active != active:
                set_training_active(job_id=job.pk, active=active, actor=actor)
                return
        enqueue_plan(job.pk, sig.value)


def save_loop_checkpoint(*, job_id: int, state: dict[str, Any]) -> None:
    """Keep what the loop must not lose; refused unless it restores into a loop for this job."""
    import json

    with transaction.atomic():
        job = lock_job(job_id, live="its loop is not checkpointed any more")
        if len(json.dumps(state)) > MAX_CHECKPOINT_BYTES:
            raise InvalidInput(f"a loop checkpoint is limited to {MAX_CHECKPOINT_BYTES} bytes", field="state")
        try:
            RolloutLoop.restore(loop_config(job), state)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise InvalidInput(f"not a loop checkpoint: {exc!r}", field="state") from None
        job.loop_state = state
        job.save(update_fields=["loop_state", "updated"])


def restore_loop(*, job_id: int) -> RolloutLoop:
    """A loop for the job: from its checkpoint if one was saved, else fresh."""
    job = Job.objects.get(pk=job_id)
    if job.loop_state:
        return RolloutLoop.restore(loop_config(job), job.loop_state)
    return RolloutLoop(loop_config(job))


def report_telemetry(*, job_id: int, message: TelemetryReport) -> int:
    """The driver's telemetry records, checked against what its job owns (`telemetry.ingest`)."""
    return telemetry.ingest(principal=job_principal(Job.objects.get(pk=job_id)), message=message)
