"""Job read models for the dashboard, the job page and the CLI's `status` (one shape for all three)."""

from __future__ import annotations

from bisect import bisect_right
from typing import Any, cast

from django.db.models import Count, Max, Min, QuerySet

from controlplane.core.state import Activity, Pool, Role, Zone
from controlplane.models import (
    Decision,
    Event,
    Job,
    Override,
    TelemetrySample,
    TrainingLend,
    Transition,
    Worker,
    WorkerGPU,
)
from controlplane.selectors.lending import cadence, lend_refusal

HISTORY_KINDS = ("step", "train")
LIVE = (Job.Status.PENDING, Job.Status.RUNNING)


def jobs(*, name: str | None = None) -> QuerySet[Job]:
    """The job list of the API, with who submitted each (`?name=` picks one: the CLI names jobs)."""
    qs = Job.objects.select_related("created_by")
    return qs.filter(name=name) if name else qs


def job_exists(job_id: int) -> bool:
    return Job.objects.filter(pk=job_id).exists()


def job_name(job_id: int) -> str:
    """The job's name, or "" when there is no such job (the job page's socket subscribes by it)."""
    return Job.objects.filter(pk=job_id).values_list("name", flat=True).first() or ""


def live_job_ids() -> list[int]:
    """Jobs pending, running or paused: what the periodic re-plan plans (a paused one's plan releases its
    rollout workers, retried until none is left)."""
    return list(Job.objects.filter(status__in=(*LIVE, Job.Status.PAUSED)).values_list("id", flat=True))


OVERRIDE_FIELDS = (
    "force_mode",
    "force_n_prefill",
    "force_n_decode",
    "force_exact",
    "freeze",
    "borrowing",
    "elasticity",
)


def override_dict(o: Override) -> dict[str, Any]:
    """An override as the API answers it (and as its audit event records it, before and after)."""
    return {f: getattr(o, f) for f in OVERRIDE_FIELDS} | {"updated": o.updated.isoformat() if o.updated else None}


def job_override(job_id: int) -> dict[str, Any]:
    """The job's override in force (every job has one from its creation; none forced reads as the defaults)."""
    return override_dict(Override.objects.filter(job_id=job_id).first() or Override(job_id=job_id))


def configuration_label(mode: str, n_prefill: int, n_decode: int, n_colocated: int) -> str:
    """The paper's notation: 2P4D for disaggregated, 6C for colocated."""
    return f"{n_prefill}P{n_decode}D" if mode == "disaggregated" else f"{n_colocated}C"


def override_summary(o: dict[str, Any] | None) -> str:
    """What is forced, in words ('' when the policy decides alone). The P:D says whether it is exact or a ratio."""
    if not o:
        return ""
    parts = []
    if o.get("force_n_prefill") and o.get("force_n_decode"):
        pd = f"{o['force_n_prefill']}P{o['force_n_decode']}D"
        parts.append(
            f"forced {pd} exactly"
            if o.get("force_exact")
            else f"forced P:D ratio {o['force_n_prefill']}:{o['force_n_decode']} (scaled to the budget)"
        )
    elif o.get("force_mode"):
        parts.append(f"forced {o['force_mode']}")
    if o.get("freeze"):
        parts.append("frozen")
    if o.get("borrowing") is False:
        parts.append("borrowing off")
    if o.get("elasticity") is False:
        parts.append("elasticity off")
    return ", ".join(parts)


def _override_dicts(job_ids: list[int]) -> dict[int, dict[str, Any]]:
    rows = Override.objects.filter(job_id__in=job_ids).values("job_id", *OVERRIDE_FIELDS)
    return {row["job_id"]: row for row in rows}


def jobs_overview(limit: int = 50) -> list[dict[str, Any]]:
    # plain dicts (the stubs type them as a closed TypedDict): each gets its "override" added below
    rows = cast(
        "list[dict[str, Any]]",
        list(
            Job.objects.order_by("-created").values(
                "id",
                "name",
                "status",
                "policy",
                "model",
                "engine",
                "mode",
                "n_prefill",
                "n_decode",
                "n_colocated",
                "step",
                "weight_version",
                "training_active",
                "failure_reason",
                "status_reason",
                "remaining",
            )[:limit]
        ),
    )
    overrides = _override_dicts([r["id"] for r in rows])
    for r in rows:
        r["override"] = override_summary(overrides.get(r["id"]))
    return rows


def event_dict(e: Event) -> dict[str, Any]:
    """An event as the API and the dashboard's event deltas show it."""
    return {
        "id": e.id,
        "kind": e.kind,
        "message": e.message,
        "job": e.job.name if e.job else None,
        "node": e.node.name if e.node else None,
        "actor": e.actor,
        "created": e.created.isoformat(),
        "data": e.data,
    }


def recent_events(limit: int = 30, *, job_id: int | None = None, kind: str = "") -> list[dict[str, Any]]:
    """Newest first, in the same shape as the `event` deltas; `kind` may be a prefix ending in '.'."""
    qs = Event.objects.select_related("job", "node").order_by("-created", "-id")
    if job_id is not None:
        qs = qs.filter(job_id=job_id)
    if kind:
        qs = qs.filter(kind__startswith=kind) if kind.endswith(".") else qs.filter(kind=kind)
    return [event_dict(e) for e in qs[:limit]]


MAX_CANDIDATES = 200


def top_candidates(candidates: list[dict[str, Any]], chosen: str, limit: int = MAX_CANDIDATES) -> list[dict[str, Any]]:
    """A large budget has one candidate per split (32k workers: 32k rows): keep colocation, the chosen one
    and the best feasible splits, so a page or a socket message stays small. The total is reported beside."""
    if len(candidates) <= limit:
        return candidates
    keep = {id(c) for c in candidates if c.get("mode") == "colocated" or c.get("label") == chosen}
    feasible = sorted(
        (c for c in candidates if c.get("feasible") and c.get("makespan_s") is not None), key=lambda c: c["makespan_s"]
    )
    for c in feasible:
        if len(keep) >= limit:
            break
        keep.add(id(c))
    return [c for c in candidates if id(c) in keep]


def decision_dict(d: Decision) -> dict[str, Any]:
    label = configuration_label(d.mode, d.n_prefill, d.n_decode, d.n_colocated)
    return {
        "id": d.id,
        "created": d.created.isoformat(),
        "signal": d.signal,
        "budget": d.budget,
        "profile": d.profile,
        "candidates": top_candidates(d.candidates, label),
        "candidates_total": len(d.candidates),
        "mode": d.mode,
        "n_prefill": d.n_prefill,
        "n_decode": d.n_decode,
        "n_colocated": d.n_colocated,
        "label": configuration_label(d.mode, d.n_prefill, d.n_decode, d.n_colocated),
        "borrow": d.borrow,
        "predicted_makespan_s": d.predicted_makespan_s,
        "expected_gain": d.expected_gain,
        "admitted": d.admitted,
        "reason": d.reason,
        "confidence": mean_confidence(d.profile),
    }


def mean_confidence(profile: dict[str, Any]) -> float | None:
    """The predictor's confidence in its fitted inputs (mean over the tracker's estimates, 0..1)."""
    conf = (profile or {}).get("confidence")
    if isinstance(conf, dict):
        values = [float(v) for v in conf.values() if isinstance(v, (int, float))]
        return round(sum(values) / len(values), 3) if values else None
    return None


def transition_dict(t: Transition) -> dict[str, Any]:
    return {
        "id": t.id,
        "status": t.status,
        "decision": t.decision_id,
        "plan": t.plan,
        "created": t.created.isoformat(),
        "started": t.started.isoformat() if t.started else None,
        "finished": t.finished.isoformat() if t.finished else None,
        "error": t.error,
        "steps": [
            {
                "index": s.index,
                "kind": s.kind,
                "worker_slot": s.worker_slot,
                "status": s.status,
                "attempts": s.attempts,
                "error": s.error,
            }
            for s in t.steps.all()
        ],
    }


def staleness(job: Job) -> dict[str, Any]:
    """How far the weights of the rollout workers that serve lag the trainer's, against the job's bound.
    Asleep (parked overlap) workers pull the weights lazily when woken, so they are counted apart, not in the lag."""
    rollout = Worker.objects.filter(job=job, alive=True).exclude(role=Role.TRAINING)
    agg = rollout.filter(activity=Activity.ACTIVE).aggregate(lo=Min("weight_version"), hi=Max("weight_version"))
    asleep = rollout.exclude(activity=Activity.ACTIVE).aggregate(n=Count("id"), lo=Min("weight_version"))
    last_step = (
        TelemetrySample.objects.filter(job=job, kind="step").order_by("-id").values_list("record", flat=True).first()
    )
    lag = job.weight_version - agg["lo"] if agg["lo"] is not None else None
    return {
        "weight_version": job.weight_version,
        "max_staleness": job.max_staleness,
        "workers_min": agg["lo"],
        "workers_max": agg["hi"],
        "lag": lag,
        "within_bound": lag is None or lag <= job.max_staleness,
        "asleep": asleep["n"],
        "asleep_min": asleep["lo"],
        "stale_aborted_last_step": (last_step or {}).get("stale_aborted", 0),
    }


def submitted_by(job: Job) -> str:
    """Who submitted the job: its user, else the actor of its job.created event (the launcher, a script)."""
    if job.created_by is not None:
        return job.created_by.username
    actor = Event.objects.filter(job=job, kind="job.created").values_list("actor", flat=True).first()
    return actor or "unknown"


SHARE_EVENT = "arbiter.reallocated"  # one division of the cluster by the arbiter (services.arbitration)
SHARE_HISTORY = 500


def share_history(limit: int = SHARE_HISTORY) -> list[dict[str, Any]]:
    """Each job's share over time, for the cluster page's stacked chart: the arbiter's divisions, oldest first
    (`gpus`: dedicated rollout GPUs allotted per job; `lent`: training GPUs lent to it by other jobs)."""
    rows = Event.objects.filter(kind=SHARE_EVENT).order_by("-id").values_list("created", "message", "data")[:limit]
    return [
        {
            "t": created.isoformat(),
            "why": message,
            "gpus": (data or {}).get("gpus", {}),
            "lent": (data or {}).get("lent", {}),
        }
        for created, message, data in reversed(list(rows))
    ]


def sharing(job: Job) -> dict[str, Any]:
    """How the job shares the cluster (issue 35): its priority, weight, guarantee and maximum, the arbiter's
    allotment (None: not divided yet), the dedicated rollout GPUs its live workers hold now, and the training GPUs
    other jobs lend it (`borrows`) or it lends them (`lends`) until the owner's next Training Begin, by job, and
    why it lends none where a limit of cross-job lending stops it (`not_lending`)."""
    held = (
        Worker.objects.filter(
            job=job, alive=True, zone=Zone.ROLLOUT, node__pool__in=[Pool.RESERVED, Pool.ELASTIC]
        ).count()
        * job.tp
    )
    borrows = dict(TrainingLend.objects.filter(borrower=job).values_list("owner__name", "gpus"))
    lends = dict(TrainingLend.objects.filter(owner=job).values_list("borrower__name", "gpus"))
    return {
        "priority": job.priority,
        "weight": job.weight,
        "min_rollout_gpus": job.min_rollout_gpus,
        "max_rollout_gpus": job.rollout_gpus,
        "allotted_rollout_gpus": job.allotted_rollout_gpus,
        "held_rollout_gpus": held,
        "borrows": borrows,
        "lends": lends,
        # why its idle training GPUs go to no other job: a limit of lending, or the last division found no lend
        # that pays ("": it lends, or none of its training GPUs was idle then)
        "not_lending": "" if lends or not job.training_gpus else _lend_refusal(job, borrows),
    }


def _lend_refusal(job: Job, borrows: dict[str, int]) -> str:
    if job.status not in LIVE:
        return ""
    jobs = list(Job.objects.filter(status__in=LIVE))
    # the last division's reason is of its idle time: while it trains, nothing of it is idle to lend
    unlent = "" if job.training_active else job.unlent_reason
    return lend_refusal(job, jobs, borrowing=bool(borrows), rhythm=cadence(job)) or unlent


def job_status(job_id: int, *, decisions: int = 50, transitions: int = 10, events: int = 50) -> dict[str, Any] | None:
    """Everything the job page and `pearl status` show: the job, the override in force, the latest
    decision in full, recent decisions (for the chart), transitions with their steps, staleness, events."""
    job = Job.objects.select_related("created_by").filter(pk=job_id).first()
    if job is None:
        return None
    o = _override_dicts([job.pk]).get(job.pk)
    recent = list(Decision.objects.filter(job=job).order_by("-created", "-id")[:decisions])
    trs = list(Transition.objects.filter(job=job).prefetch_related("steps").order_by("-created", "-id")[:transitions])
    return {
        "job": {
            "id": job.pk,
            "name": job.name,
            "status": job.status,
            "failure_reason": job.failure_reason,
            "status_reason": job.status_reason,
            "remaining": job.remaining,
            "model": job.model,
            "engine": job.engine,
            "hardware": job.hardware,
            "hardware_types": job.rollout_hardware,
            "environment": job.environment,
            "policy": job.policy,
            "tp": job.tp,
            "batch_size": job.batch_size,
            "group_size": job.group_size,
            "max_staleness": job.max_staleness,
            "max_trajectory_tokens": job.max_trajectory_tokens,
            "rollout_gpus": job.rollout_gpus,
            "training_gpus": job.training_gpus,
            "sharing": sharing(job),
            "mode": job.mode,
            "n_prefill": job.n_prefill,
            "n_decode": job.n_decode,
            "n_colocated": job.n_colocated,
            "configuration": configuration_label(job.mode, job.n_prefill, job.n_decode, job.n_colocated),
            "step": job.step,
            "weight_version": job.weight_version,
            "training_active": job.training_active,
            "created_by": job.created_by.username if job.created_by else None,
            "created": job.created.isoformat(),
            "submitted_by": submitted_by(job),
            "agent": job.agent or None,
            "checkpoint_every": job.checkpoint_every,
            "checkpoint_keep": job.checkpoint_keep,
            "checkpoint_dir": job.checkpoint_dir,
            "init_from": job.init_from,
            "tracking": job.tracking,
            "tracking_state": job.tracking_state,
            "stopped_at": job.stopped_at.isoformat() if job.stopped_at else None,
        },
        "override": ({k: v for k, v in o.items() if k != "job_id"} if o else None),
        "override_summary": override_summary(o),
        "latest_decision": decision_dict(recent[0]) if recent else None,
        "decisions": [
            {
                "id": d.id,
                "created": d.created.isoformat(),
                "label": configuration_label(d.mode, d.n_prefill, d.n_decode, d.n_colocated),
                "predicted_makespan_s": d.predicted_makespan_s,
                "expected_gain": d.expected_gain,
                "admitted": d.admitted,
                "signal": d.signal,
                "reason": d.reason,
                "borrow": d.borrow,
            }
            for d in reversed(recent)
        ],
        "transitions": [transition_dict(t) for t in trs],
        "staleness": staleness(job),
        "workers": job_workers(job),
        "events": recent_events(events, job_id=job.pk),
    }


def job_workers(job: Job) -> list[dict[str, Any]]:
    """The job's alive workers in slot order, each with its node, chip type and GPU indexes (one query): a
    mixed pool shows which type each worker runs on (a worker's GPUs are one node's, so one type)."""
    out: dict[int, dict[str, Any]] = {}
    for w in (
        Worker.objects.filter(job=job, alive=True)
        .order_by("slot", "id")
        .values(
            "id", "slot", "role", "activity", "zone", "weight_version", "node__name", "node__pool", "node__hardware"
        )
    ):
        out[w["id"]] = {
            "slot": w["slot"],
            "role": w["role"],
            "activity": w["activity"],
            "zone": w["zone"],
            "node": w["node__name"],
            "pool": w["node__pool"],
            "hardware": w["node__hardware"],
            "weight_version": w["weight_version"],
            "gpus": [],
        }
    for wid, index in (
        WorkerGPU.objects.filter(worker_id__in=list(out), alive=True)
        .order_by("gpu__index")
        .values_list("worker_id", "gpu__index")
    ):
        out[wid]["gpus"].append(index)
    return list(out.values())


def job_series(job_id: int, *, limit: int = 2000) -> dict[str, Any]:
    """Per-step history from the STEP and TRAIN telemetry records (oldest first), with the predictor's
    confidence taken from the decision in force when each step finished."""
    rows = list(
        TelemetrySample.objects.filter(job_id=job_id, kind__in=HISTORY_KINDS)
        .order_by("-id")
        .values_list("kind", "record", "created")[:limit]
    )[::-1]
    decided = list(
        Decision.objects.filter(job_id=job_id).order_by("created", "id").values_list("created", "profile", "reason")
    )
    times = [d[0] for d in decided]
    steps: list[dict[str, Any]] = []
    train: list[dict[str, Any]] = []
    for kind, rec, created in rows:
        if kind == "train":
            train.append(
                {
                    k: rec.get(k, 0)
                    for k in (
                        "step",
                        "duration_s",
                        "return_latency_s",
                        "return_deadline_s",
                        "loss",
                        "weight_version",
                        "time_s",
                    )
                }
            )
            continue
        i = bisect_right(times, created) - 1
        steps.append(
            {
                k: rec.get(k, 0)
                for k in (
                    "step",
                    "makespan_s",
                    "predicted_makespan_s",
                    "predicted_at_start_s",
                    "generated_tokens_total",
                    "train_tokens",
                    "reward_mean",
                    "reward_std",
                    "borrowed_gpu_s",
                    "stale_aborted",
                    "interruptions",
                    "n_prefill",
                    "n_decode",
                    "n_colocated",
                    "batch_size",
                    "time_s",
                )
            }
            | {
                "mode": rec.get("mode", ""),
                "confidence": mean_confidence(decided[i][1]) if i >= 0 else None,
                # what the experiment trackers log beside the numbers (issue 36): the configuration the step ran
                # and the reason of the decision in force when it finished
                "configuration": configuration_label(
                    rec.get("mode", ""), rec.get("n_prefill", 0), rec.get("n_decode", 0), rec.get("n_colocated", 0)
                ),
                "why": decided[i][2] if i >= 0 else "",
            }
        )
    return {"steps": with_throughput(steps), "train": train}


def with_throughput(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Throughput per step = (generated + training tokens) / step duration, where a step lasts from the
    previous step's end to its own (its rollout makespan for the first one)."""
    prev_t: float | None = None
    for s in steps:
        t = float(s.get("time_s") or 0.0)
        dur = t - prev_t if prev_t is not None and t > prev_t else float(s.get("makespan_s") or 0.0)
        tokens = (s.get("generated_tokens_total") or 0) + (s.get("train_tokens") or 0)
        s["duration_s"] = round(dur, 3)
        s["throughput_tok_s"] = round(tokens / dur, 3) if dur > 0 else None
        prev_t = t if t > 0 else prev_t
    return steps
