"""Job use cases: create, stop, pause and resume, overrides, training begin/finish."""

from __future__ import annotations

import math
import os
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from controlplane.core.agent_spec import SpecError, validate_agent_spec
from controlplane.core.context import Signal
from controlplane.core.model_dir import ModelDirError, is_model_dir_spec
from controlplane.core.policies import POLICY_NAMES, PRODUCT_POLICIES, OptionError, names, validate_options
from controlplane.core.profiles import get_hardware, get_profile, known_models
from controlplane.core.state import Activity, Mode, Pool, Role
from controlplane.models import Job, Node, Override, Worker, WorkerGPU
from controlplane.selectors import model_dirs
from controlplane.selectors.driver import not_returned
from controlplane.selectors.jobs import OVERRIDE_FIELDS, override_dict, override_summary
from controlplane.selectors.nodes import available_gpus
from controlplane.services import checkpoints, tracking
from controlplane.services.errors import Conflict, InvalidInput
from controlplane.services.events import emit, notify_drivers_on_commit, push_delta_on_commit
from controlplane.services.invariants import assert_invariants
from controlplane.services.locks import lock_job, lock_nodes
from controlplane.services.nodes import bump_generations, push_nodes
from controlplane.services.plan_queue import enqueue_arbitration, enqueue_phase_arbitration, enqueue_plan
from controlplane.services.workers import return_borrowed

TERMINAL = (Job.Status.STOPPED, Job.Status.FAILED)
LIVE_STATUSES = (Job.Status.PENDING, Job.Status.RUNNING, Job.Status.PAUSED)  # jobs that hold (or will) a guarantee
MAX_TASK_FILE_BYTES = 64 << 20  # what submission reads of an agent job's task file


def job_delta(job: Job) -> dict[str, Any]:
    return {
        "id": job.pk,
        "name": job.name,
        "status": job.status,
        "mode": job.mode,
        "n_prefill": job.n_prefill,
        "n_decode": job.n_decode,
        "n_colocated": job.n_colocated,
        "step": job.step,
        "weight_version": job.weight_version,
        "training_active": job.training_active,
        "policy": job.policy,
        "status_reason": job.status_reason,
        "failure_reason": job.failure_reason,
        "remaining": job.remaining,
    }


def create_job(*, spec: dict[str, Any], actor: str, user: Any = None) -> Job:
    """Validate a job spec against the cluster and record it (pending until the planner places it)."""
    policy = spec.get("policy", names.PEARL)
    if policy not in PRODUCT_POLICIES:
        if policy in POLICY_NAMES:
            raise InvalidInput(
                f"policy {policy!r} is a reference for reports, not a product policy; "
                f"expected one of {list(PRODUCT_POLICIES)}",
                field="policy",
            )
        raise InvalidInput(f"unknown policy {policy!r}; expected one of {list(PRODUCT_POLICIES)}", field="policy")
    try:
        spec = {**spec, "policy_options": validate_options(policy, spec.get("policy_options") or {})}
    except OptionError as exc:
        raise InvalidInput(str(exc), field=f"policy_options.{exc.option}") from None
    spec = _with_agent(spec)
    _check_model(spec)
    spec = tracking.check_spec(checkpoints.check_settings(spec))  # issue 36: checkpoints, init_from, trackers
    tp = int(spec.get("tp", 1))
    try:
        get_profile(spec.get("hardware", "cpu"), spec.get("model", "tiny"), tp)
    except ValueError as exc:  # the profile names what it does not know
        msg = str(exc)
        field = next((f for f in ("hardware", "model") if msg.startswith(f"unknown {f}")), "tp")
        raise InvalidInput(msg, field=field) from None
    spec = _with_hardware_types(spec, tp)
    gpus = available_gpus()
    rollout_gpus = int(spec.get("rollout_gpus", 0))
    training_gpus = int(spec.get("training_gpus", 0))
    rollout_capacity = gpus[Pool.RESERVED] + gpus[Pool.ELASTIC]
    if rollout_gpus > rollout_capacity:
        raise InvalidInput(
            f"rollout_gpus={rollout_gpus} is above the cluster's {rollout_capacity} rollout GPUs", field="rollout_gpus"
        )
    if training_gpus > gpus[Pool.TRAINING]:
        raise InvalidInput(
            f"training_gpus={training_gpus} is above the cluster's {gpus[Pool.TRAINING]} training GPUs",
            field="training_gpus",
        )
    if rollout_gpus % tp or training_gpus % tp:
        raise InvalidInput(f"GPU counts must be multiples of tp={tp}", field="tp")
    _check_sharing(spec, rollout_gpus, tp)
    with transaction.atomic():
        if Job.objects.filter(name=spec["name"]).exists():
            raise Conflict(f"a job named {spec['name']!r} exists", field="name")
        _admit_guarantee(int(spec.get("min_rollout_gpus", 0)), gpus[Pool.RESERVED])
        try:
            with transaction.atomic():  # a concurrent create of the same name loses here, not with a 500
                job = Job.objects.create(**spec, created_by=user if getattr(user, "is_authenticated", False) else None)
        except IntegrityError:
            raise Conflict(f"a job named {spec['name']!r} exists", field="name") from None
        Override.objects.create(job=job)
        emit(
            kind="job.created",
            message=f"job {job.name} created ({job.model}, {job.engine}, policy {job.policy})",
            job=job,
            actor=actor,
            data={"spec": {k: v for k, v in spec.items()}},
        )
        push_delta_on_commit(kind="job", key=str(job.pk), data=job_delta(job))
        enqueue_arbitration(f"job {job.name} arrived")  # the arbiter allots its share, then plans it
    return job


def _check_sharing(spec: dict[str, Any], rollout_gpus: int, tp: int) -> None:
    """priority, weight and min_rollout_gpus (issue 35): how the job shares the cluster; a bad value names its
    field (the API checks the JSON types, this the values, for every caller)."""
    priority, weight, guarantee = spec.get("priority", 0), spec.get("weight", 1.0), spec.get("min_rollout_gpus", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidInput("priority must be an integer", field="priority")
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not (math.isfinite(weight) and weight > 0):
        raise InvalidInput(f"weight must be a positive number, not {weight!r}", field="weight")
    if isinstance(guarantee, bool) or not isinstance(guarantee, int) or guarantee < 0:
        raise InvalidInput("min_rollout_gpus must be an integer >= 0", field="min_rollout_gpus")
    if guarantee % tp:
        raise InvalidInput(f"min_rollout_gpus={guarantee} is not a multiple of tp={tp}", field="min_rollout_gpus")
    if rollout_gpus and guarantee > rollout_gpus:
        raise InvalidInput(
            f"min_rollout_gpus={guarantee} is above rollout_gpus={rollout_gpus} (the job's maximum)",
            field="min_rollout_gpus",
        )


def _admit_guarantee(guarantee: int, reserved: int) -> None:
    """A guarantee is admitted only if the reserved pool holds it beside every live job's (pending, running or
    paused: a paused job gets its guarantee back when it resumes). Preemptible GPUs do not count: they may
    leave at any time. Refused at submission rather than queued: a guarantee is a promise made when the job
    is admitted, and a queued one would wait behind the others' for as long as they run, unbounded; the
    refusal gives the arithmetic now, and the submitter lowers it (0 runs on the fair share) or stops a job."""
    if guarantee <= 0:
        return
    held = list(
        Job.objects.filter(status__in=LIVE_STATUSES, min_rollout_gpus__gt=0)
        .order_by("name")
        .values_list("name", "min_rollout_gpus")
    )
    taken = sum(g for _, g in held)
    if taken + guarantee > reserved:
        detail = f" ({', '.join(f'{n}: {g}' for n, g in held)})" if held else ""
        raise InvalidInput(
            f"min_rollout_gpus={guarantee} cannot be guaranteed: the reserved pool has {reserved} GPUs, the live "
            f"jobs' guarantees take {taken}{detail}, {max(0, reserved - taken)} are left "
            f"({taken} + {guarantee} > {reserved}); lower it or stop a job",
            field="min_rollout_gpus",
        )


def _with_hardware_types(spec: dict[str, Any], tp: int) -> dict[str, Any]:
    """`hardware_types`: the chip types the job's rollout pool may gather (issue 23), each one the profiles know
    and the model fits on at the job's TP, named once; kept as core.profiles spells them (H800, H20, A100), so
    the planner matches them against the GPUs' hardware. Absent or empty: only the job's `hardware`."""
    types = spec.get("hardware_types")
    if types is None or types == []:
        return {k: v for k, v in spec.items() if k != "hardware_types"}
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        raise InvalidInput("hardware_types must be a list of chip type names", field="hardware_types")
    out: list[str] = []
    for t in types:
        try:
            name = get_hardware(t).name
            get_profile(name, spec.get("model", "tiny"), tp)
        except ValueError as exc:
            raise InvalidInput(f"hardware_types: {exc}", field="hardware_types") from None
        if name in out:
            raise InvalidInput(f"hardware_types names {name} twice", field="hardware_types")
        out.append(name)
    return {**spec, "hardware_types": out}


def _check_model(spec: dict[str, Any]) -> None:
    """`model` is a profile's model name or the absolute path of a `save_pretrained` directory this process can
    read (as the agent spec's files, checked where the job is submitted): one that is missing, has no weights,
    has an unsupported architecture or a tokenizer without a chat template is a 400 naming which, and its
    profile, derived from its config.json, is registered for the checks below and the planner."""
    model = str(spec.get("model", "tiny"))
    if not is_model_dir_spec(model):
        if model.lower() not in known_models() and "/" in model:
            raise InvalidInput(f"model directory {model!r} must be given as an absolute path", field="model")
        return
    if spec.get("engine", "emulated") == "emulated":
        raise InvalidInput(
            "a model directory runs on engine 'torch' or 'vllm' (the emulated engine runs the profiles' models: "
            f"{', '.join(known_models())})",
            field="model",
        )
    try:
        model_dirs.inspect(model)
        model_dirs.ensure_profile(model)
    except ModelDirError as exc:
        raise InvalidInput(str(exc), field="model") from None


def _with_agent(spec: dict[str, Any]) -> dict[str, Any]:
    """`environment: agent` needs a valid agent spec (core.agent_spec, checked against the files this
    process can see: the task file must be readable, the workdir a directory); other environments none."""
    agent = spec.get("agent")
    if spec.get("environment") != "agent":
        if agent:
            first = next(iter(agent))
            raise InvalidInput(f"{first} is only for environment 'agent'", field=first)
        return {k: v for k, v in spec.items() if k != "agent"}
    agent = dict(agent or {})
    try:
        validate_agent_spec(agent, read_file=_read_text, is_dir=os.path.isdir)
    except SpecError as exc:
        raise InvalidInput(str(exc), field=exc.field) from None
    return {**spec, "agent": agent}


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8") as f:  # UnicodeDecodeError is a ValueError: the spec's error
        return f.read(MAX_TASK_FILE_BYTES + 1)[:MAX_TASK_FILE_BYTES]


def stop_job(*, job_id: int, actor: str) -> Job:
    """Stop every worker of the job and mark it stopped (409 if it already ended)."""
    return _end_job(job_id=job_id, status=Job.Status.STOPPED, reason="", actor=actor)


def fail_job(*, job_id: int, reason: str, actor: str = "system") -> Job:
    """The job cannot go on: its workers are released and `reason` says why (shown on its page)."""
    return _end_job(job_id=job_id, status=Job.Status.FAILED, reason=reason, actor=actor)


def pause_job(*, job_id: int, actor: str) -> Job:
    """Pause a running job (issue 34): it gives its rollout GPUs back and keeps the rest. The planner releases
    its rollout workers by a transition that drains each first (a turn in flight finishes, or goes back to the
    rollout driver with its partial output, which the driver keeps), then stops it (a borrowed overlap worker
    goes back to sleep). Its training workers stay, and with them the trainer (an update in progress finishes
    and is published), its checkpoint and step buffer, the rollout driver with the loop (its step, weight
    version, finished and partial trajectories) and the records. The training GPUs are kept, not released:
    the trainer's checkpoint and buffer live in its worker's state directory on its node, which a new training
    worker would not restore from. 409 naming the status unless the job is running; nothing changes then."""
    with transaction.atomic():
        job = lock_job(job_id, live="it cannot be paused")
        if job.status != Job.Status.RUNNING:
            raise Conflict(f"job {job.name} is {job.status}; only a running job can be paused", field="status")
        job.status = Job.Status.PAUSED
        job.status_reason = ""
        job.save(update_fields=["status", "status_reason", "updated"])
        emit(
            kind="job.paused",
            message=f"job {job.name} paused by {actor} at step {job.step} (weights v{job.weight_version}): "
            "its rollout workers are released, its trainer, driver, checkpoint and records kept",
            job=job,
            actor=actor,
            data={"step": job.step, "weight_version": job.weight_version},
        )
        push_delta_on_commit(kind="job", key=str(job.pk), data=job_delta(job))
        notify_drivers_on_commit([job.pk])
        enqueue_plan(job.pk, Signal.CAPACITY_CHANGE)  # the release (deferred while a transition is in flight)
        enqueue_arbitration(f"job {job.name} paused")
    return job


def resume_job(*, job_id: int, actor: str) -> Job:
    """Resume a paused job where it was: running again, the planner places its rollout workers as for any
    change of capacity, and the driver's loop goes on with the step, the weights and the trajectories it kept
    (none finished is run again). 409 naming the status unless the job is paused; nothing changes then."""
    with transaction.atomic():
        job = lock_job(job_id, live="it cannot be resumed")
        if job.status != Job.Status.PAUSED:
            raise Conflict(f"job {job.name} is {job.status}; only a paused job can be resumed", field="status")
        job.status = Job.Status.RUNNING
        job.save(update_fields=["status", "updated"])
        emit(
            kind="job.resumed",
            message=f"job {job.name} resumed by {actor} at step {job.step} (weights v{job.weight_version})",
            job=job,
            actor=actor,
            data={"step": job.step, "weight_version": job.weight_version},
        )
        push_delta_on_commit(kind="job", key=str(job.pk), data=job_delta(job))
        notify_drivers_on_commit([job.pk])
        enqueue_plan(job.pk, Signal.CAPACITY_CHANGE)
        enqueue_arbitration(f"job {job.name} resumed")
    return job


def _end_job(*, job_id: int, status: str, reason: str, actor: str) -> Job:
    with transaction.atomic():
        job = lock_job(job_id, live="it cannot be stopped again")
        now = timezone.now()
        workers = list(Worker.objects.filter(job=job, alive=True))
        held = lock_nodes(w.node_id for w in workers)  # the lock order: the nodes, then their workers
        Worker.objects.filter(pk__in=[w.pk for w in workers]).update(
            alive=False, activity=Activity.INACTIVE, stopped_at=now
        )
        WorkerGPU.objects.filter(worker__in=workers).update(alive=False, active=False)
        job.status = status
        job.stopped_at = now
        job.training_active = False
        job.failure_reason = reason[:4000]
        job.save(update_fields=["status", "stopped_at", "training_active", "failure_reason", "updated"])
        bump_generations(held.values())
        push_nodes(held)
        notify_drivers_on_commit([job.pk])
        if status == Job.Status.FAILED:
            emit(
                kind="job.failed",
                message=f"job {job.name} failed: {reason} ({len(workers)} worker(s) released)"[:4000],
                job=job,
                actor=actor,
            )
        else:
            emit(
                kind="job.stopped",
                message=f"job {job.name} stopped ({len(workers)} worker(s) released)",
                job=job,
                actor=actor,
            )
        push_delta_on_commit(kind="job", key=str(job.pk), data=job_delta(job))
        enqueue_arbitration(f"job {job.name} {'stopped' if status == Job.Status.STOPPED else 'failed'}")
    return job


def set_overrides(*, job_id: int, changes: dict[str, Any], actor: str, user: Any = None) -> Override:
    """Set manual overrides (audited: the event records before and after)."""
    unknown = set(changes) - set(OVERRIDE_FIELDS)
    if unknown:
        raise InvalidInput(f"unknown override field(s) {sorted(unknown)}", field=sorted(unknown)[0])
    with transaction.atomic():
        job = lock_job(job_id, live="overrides cannot change")
        o, _ = Override.objects.get_or_create(job=job)
        before = override_dict(o)
        for k, v in changes.items():
            setattr(o, k, v if v is not None or k in ("force_n_prefill", "force_n_decode") else "")
        if o.force_mode and o.force_mode not in (Mode.COLOCATED, Mode.DISAGGREGATED):
            raise InvalidInput(f"unknown mode {o.force_mode!r}", field="force_mode")
        n_p, n_d = o.force_n_prefill, o.force_n_decode
        if n_p is not None or n_d is not None:
            if n_p is None or n_d is None or min(n_p, n_d) < 1:
                raise InvalidInput(
                    "a forced ratio needs force_n_prefill >= 1 and force_n_decode >= 1", field="force_n_prefill"
                )
            if o.force_mode == Mode.COLOCATED:
                raise InvalidInput("a forced P:D ratio contradicts force_mode=colocated", field="force_mode")
            most = (job.rollout_gpus + job.training_gpus) // max(1, job.tp)  # dedicated + every borrowable worker
            if most and n_p + n_d > most:
                field = "force_n_prefill" if "force_n_prefill" in changes else "force_n_decode"
                raise InvalidInput(
                    f"a forced {n_p}:{n_d} ratio needs {n_p + n_d} rollout workers; "
                    f"job {job.name} can have at most {most} (GPUs / tp={job.tp})",
                    field=field,
                )
        elif changes.get("force_exact"):
            raise InvalidInput("force_exact needs force_n_prefill and force_n_decode", field="force_exact")
        else:
            o.force_exact = False  # no P:D in force: nothing to be exact about
        o.updated_by = user if getattr(user, "is_authenticated", False) else None
        o.save()
        after = override_dict(o)
        emit(
            kind="override.set",
            message=f"{job.name}: overrides changed by {actor}",
            job=job,
            actor=actor,
            data={"before": before, "after": after},
        )
        push_delta_on_commit(
            kind="override", key=str(job.pk), data={"job": job.name, **after, "summary": override_summary(after)}
        )
        enqueue_plan(job.pk, "periodic")
    return o


def set_training_active(*, job_id: int, active: bool, actor: str = "system") -> Job:
    """Training Begin / Training Finished (the rollout driver's signals).

    Begin: nothing may be borrowed any more; every borrowed overlap worker is sent back at once (the
    agents abort, park and confirm: the return is due by a deadline and does not wait for the
    TRAINING_BEGIN re-plan), and the trainer computes only once they are back (`start_update`).
    Finished: the trainer stops computing; training GPUs may be borrowed again."""
    with transaction.atomic():
        job = lock_job(job_id, live="training cannot begin or finish")
        if job.training_active == active:
            raise Conflict(
                f"job {job.name} training is already {'active' if active else 'idle'}", field="training_active"
            )
        held: dict[int, Node] = {}
        if active:
            job.returned_at_training_begin = len(return_borrowed(job, actor=actor))
        else:
            trainers = list(Worker.objects.filter(job=job, alive=True, role=Role.TRAINING))
            held = lock_nodes(w.node_id for w in trainers)  # the lock order: the nodes, then their workers
            Worker.objects.filter(pk__in=[w.pk for w in trainers]).update(activity=Activity.INACTIVE)
            WorkerGPU.objects.filter(worker__in=trainers).update(active=False)
        job.training_active = active
        job.save(update_fields=["training_active", "returned_at_training_begin", "updated"])
        bump_generations(held.values())
        push_nodes(held)
        emit(
            kind="training.begin" if active else "training.finished",
            message=f"{job.name}: {'Training Begin' if active else 'Training Finished'}",
            job=job,
            actor=actor,
        )
        push_delta_on_commit(kind="job", key=str(job.pk), data=job_delta(job))
        notify_drivers_on_commit([job.pk])
        enqueue_plan(job.pk, "training_begin" if active else "training_finished")
        enqueue_phase_arbitration(job, training=active)  # the arbiter divides again (when another job shares)
    return job


def start_update(*, job_id: int, actor: str = "system") -> Job:
    """The trainer computes the update: only after Training Begin and once every borrowed worker is
    back (409 naming the ones that are not, so the caller waits for the return)."""
    with transaction.atomic():
        job = lock_job(job_id, live="it cannot train")
        if not job.training_active:
            raise Conflict(f"job {job.name}: Training Begin comes before the update", field="training_active")
        out = not_returned(job)  # parked here and, where their agents are up, reported asleep
        if out:
            raise Conflict(
                f"job {job.name}: borrowed worker(s) {sorted(w.slot for w in out if w.job_id == job.pk)} are not "
                "returned yet"
                + "".join(
                    f"; job {w.job.name}'s worker {w.slot} on its lent training GPUs is not back yet"
                    for w in out
                    if w.job_id != job.pk
                ),
                field="borrowed",
            )
        trainers = list(Worker.objects.filter(job=job, alive=True, role=Role.TRAINING))
        held = lock_nodes(w.node_id for w in trainers)  # the lock order: the nodes, then their workers
        Worker.objects.filter(pk__in=[w.pk for w in trainers]).update(activity=Activity.ACTIVE)
        assert_invariants(job_ids=[job.pk])
        WorkerGPU.objects.filter(worker__in=trainers).update(active=True)
        bump_generations(held.values())
        push_nodes(held)
        emit(kind="training.update", message=f"{job.name}: the trainer computes the update", job=job, actor=actor)
    return job
