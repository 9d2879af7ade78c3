"""The live cluster arbiter (issue 35): on each cluster event (a job arrives or ends, a node's capacity comes or
goes, a job pauses or resumes, a job's Training Begin or Finished while another job shares the cluster; and
every periodic re-plan) one division of the dedicated rollout GPUs among the
running jobs, by `core.arbiter.arbitrate`, the code the simulator's `pearl` sharing runs.

The division is stored as each job's `allotted_rollout_gpus`; the planner caps the job's dedicated workers there
(`planner.job_inventory`), and each job's own PEARL decision (mode, P:D ratio, its own borrowing of its idle
training GPUs) runs inside it. Capacity moves between jobs only through the paths that keep work: the job over
its allotment is planned first, and its transition drains the workers it gives up (a turn in flight finishes
or comes back to the driver with its partial output, which goes on elsewhere); a training worker is never
touched. Once that transition has stopped them (`plan_queue.replan_short_jobs`) the job under its allotment is
planned again and starts workers on the freed units. An `arbiter.reallocated` event explains each change
('job b arrived: a 4→2, b 0→2', in units of `unit_gpus` GPUs).

The same division lends idle training units across jobs (`services.lending`: stored as `TrainingLend` rows,
the borrower planned to use them, each due back by the owner's predicted Training Begin less the time its
returns take), within the limits said there (TPs that divide, accepted chip types, a job lends or borrows). A division
of a cluster whose jobs accept different chip types is one pool of the types any job accepts, each job capped
at the units of its own types.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.db import transaction

from controlplane.core.arbiter import (
    Allotment,
    ArbiterConfig,
    JobDemand,
    Lend,
    arbitrate,
    division_unit,
    lend_saving,
)
from controlplane.core.borrowing import return_deadline
from controlplane.core.policies.base import best_step_time
from controlplane.core.profiles import get_reconfig_costs
from controlplane.core.state import NodeStatus, Pool, Zone
from controlplane.models import GPU, Job, Worker
from controlplane.selectors.jobs import LIVE, SHARE_EVENT
from controlplane.selectors.lending import (
    Cadence,
    cadence,
    lend_gpus,
    lend_refusal,
    lendable_groups,
    lendable_training_units,
    lends_of,
    measured_reload_s,
)
from controlplane.services.events import emit, push_delta_on_commit
from controlplane.services.lending import store_lends
from controlplane.services.planner import job_policy, last_division

log = logging.getLogger(__name__)

# a lend is due before the owner's Training Begin by the time its returns measurably take (`deactivation_s`),
# not by the simulator's fixed margin: the owner's update waits for the return in any case (`jobs.start_update`)
LIVE_CONFIG = ArbiterConfig(return_margin_s=0.0)
EVENT_KIND = SHARE_EVENT
ARBITRATED = LIVE  # the jobs divided among: pending and running (a paused job holds no rollout unit)


@dataclass(frozen=True, slots=True)
class Rebalance:
    """One division: what each job is allotted (GPUs), the order to plan them in, and why it changed."""

    allotted: dict[int, int]  # job id -> dedicated rollout GPUs
    plan_order: list[tuple[int, str]]  # (job id, signal): the shrinking jobs first, then the growing, then pending
    explanation: str
    unit_gpus: int
    capacity_gpus: int


def _groups() -> dict[tuple[int, str], int]:
    """GPUs per (node, chip) on ready reserved / elastic nodes: what dedicated rollout workers may run on."""
    out: dict[tuple[int, str], int] = {}
    for node_id, hw in GPU.objects.filter(
        present=True, node__status=NodeStatus.READY, node__pool__in=[Pool.RESERVED, Pool.ELASTIC]
    ).values_list("node_id", "hardware"):
        key = (node_id, hw.lower())
        out[key] = out.get(key, 0) + 1
    return out


def _amdahl(n: int) -> float:
    return math.inf if n <= 0 else 1.0 + 10.0 / n


def _curve(job: Job, unit_gpus: int, rhythm: Cadence | None) -> tuple[Callable[[int], float], bool]:
    """The job's predicted step time with n arbiter units (`best_step_time`: its rollout makespan from its own
    policy's fitted predictor, the one its decision uses, against its trainer's update as its cadence measures
    it), in its loop's clock, and whether the predictor has measured the job yet (`FittedProfile.measured`); a
    policy without a predictor (or a profile that cannot be read) gets a plain 1/n curve, which shares by
    weight alone."""
    try:
        tracker = getattr(job_policy(job), "tracker", None)
        if tracker is None:
            return _amdahl, True
        fp = tracker.fitted()
    except Exception:  # a job whose policy cannot be built is planned (and failed) by the planner, not here
        log.debug("no predictor for job %s; its curve is 1/n", job.pk, exc_info=True)
        return _amdahl, True
    memo: dict[int, float] = {}
    update_s = rhythm.update_s if rhythm else 0.0

    def at(n: int) -> float:
        workers = n * unit_gpus // max(1, job.tp)
        if workers not in memo:
            memo[workers] = best_step_time(
                fp.workload,
                fp.coefficients,
                workers,
                update_s,
                max_staleness=job.max_staleness,
                error=fp.makespan_error,
            )
        return memo[workers]

    return at, fp.measured


def _costs(job: Job, rhythm: Cadence | None) -> tuple[float, float]:
    """(reload, KV loss) of one more worker of the job, in its loop's clock (the one its predictor's curve is
    in): the reload is what its own new workers took to serve (wall) where it started some, else its model's
    sourced cost."""
    try:
        costs = get_reconfig_costs(job.model)
        reload_s, kv_s = costs.inter_scale_preparation_s, costs.inter_scale_finalisation_s
    except ValueError:  # a model directory without sourced costs: moves are gated by hysteresis alone
        reload_s, kv_s = 0.0, 0.0
    measured = measured_reload_s(job)
    if measured is not None:
        reload_s = measured / (rhythm.scale if rhythm else 1.0)
    return reload_s, kv_s


def _demand(job: Job, unit_gpus: int, own_units: int, lending: Lending, rhythm: Cadence | None) -> JobDemand:
    reload_s, kv_s = _costs(job, rhythm)
    most = job.rollout_gpus // unit_gpus if job.rollout_gpus else own_units
    lendable, groups, tb, returns_s = lending.offer(job, rhythm)
    step_time, measured = _curve(job, unit_gpus, rhythm)
    return JobDemand(
        name=job.name,
        max_units=min(most, own_units),
        step_time=step_time,
        priority=job.priority,
        weight=job.weight if job.weight > 0 else 1.0,
        min_units=job.min_rollout_gpus // unit_gpus,
        arrival_s=job.created.timestamp(),
        training=job.training_active,
        lendable_units=lendable,
        lendable_groups=groups,
        training_begin_s=tb,
        deactivation_s=returns_s,
        reload_s=reload_s,
        kv_loss_s=kv_s,
        outstanding=(job.remaining if job.remaining is not None else job.batch_size) * job.tp,
        worker_units=max(1, job.tp // unit_gpus),
        measured=measured,
    )


@dataclass(frozen=True, slots=True)
class Lending:
    """Which jobs may lend their idle training units in this division (`services.lending`): a job lends only
    what every other job's rollout accepts, to jobs whose TP divides its own or is a multiple of it, and only if
    it borrows nothing now."""

    jobs: list[Job]
    borrowing: set[int]  # jobs that hold a lend now: they lend nothing (no two jobs wait on each other)
    now_s: float
    unit_gpus: int  # the division's unit

    def offer(self, job: Job, rhythm: Cadence | None) -> tuple[int, dict[int, int], float, float]:
        """(division units of its training GPUs it may lend, how many larger-TP workers they hold placed (by
        their size in units: `JobDemand.lendable_groups`), loop seconds to its next Training Begin, loop seconds
        its returns take); (0, {}, inf, 0) if it lends none."""
        if lend_refusal(job, self.jobs, borrowing=job.pk in self.borrowing, rhythm=rhythm) or rhythm is None:
            return (0, {}, math.inf, 0.0)
        units = lendable_training_units(job)  # read once: the count and the placed groups
        groups = lendable_groups(job, units, {j.tp for j in self.jobs if j.pk != job.pk})
        return (
            len(units) * job.tp // self.unit_gpus,
            {t // self.unit_gpus: n for t, n in groups.items()},
            rhythm.until_next_begin_s(self.now_s),
            rhythm.return_s,
        )


@dataclass(frozen=True, slots=True)
class LendOutlook:
    """What lending one of an owner's idle training units to a borrower saves, from a moment after the owner's
    Training Finished (at best: then, its whole idle window ahead), weighed as the arbiter weighs a lend
    (`core.arbiter.lend_saving`); loop seconds."""

    window_s: float  # from the division to the latest start of the return, before the next Training Begin
    reload_s: float  # the borrower's new worker, until it serves
    deactivation_s: float  # the owner's return
    makespan_s: float  # the borrower's predicted step time at its units now (`_curve`, as the division weighs it)
    makespan_more_s: float  # ... with the lent unit
    saving_s: float  # net of the reload and the return; -inf: no lend pays

    @property
    def pays(self) -> bool:
        return self.saving_s > 0

    def __str__(self) -> str:
        return (
            f"window {self.window_s:.1f} s, borrower's reload {self.reload_s:.1f} s, owner's return "
            f"{self.deactivation_s:.1f} s, borrower's step {self.makespan_s:.1f} → {self.makespan_more_s:.1f} s"
            f" with one more unit: {'saves ' + format(self.saving_s, '.1f') + ' s' if self.pays else 'does not pay'}"
        )


def lend_outlook(owner: Job, borrower: Job, *, after_s: float = 0.0) -> LendOutlook | None:
    """Could a lend of `owner`'s idle training unit to `borrower` pay, as a division `after_s` loop seconds after
    the owner's Training Finished sees it (0: at best)? None before the owner has trained twice (its period is
    unknown: it lends nothing)."""
    rhythm = cadence(owner)
    if rhythm is None:
        return None
    unit = lend_gpus(owner.tp, borrower.tp)
    n = max(1, (borrower.allotted_rollout_gpus or 0) // unit)
    borrower_rhythm = cadence(borrower)
    curve, _ = _curve(borrower, unit, borrower_rhythm)
    reload_s, _ = _costs(borrower, borrower_rhythm)
    dl = return_deadline(  # in loop seconds from Training Finished
        training_begin_s=rhythm.period_s - rhythm.return_s - rhythm.update_s,
        deactivation_s=rhythm.return_s,
        now_s=after_s,
        margin_s=LIVE_CONFIG.return_margin_s,
    )
    window, t_now, t_more = dl.start_by_s - after_s, curve(n), curve(n + 1)
    saving = lend_saving(
        window_s=window, reload_s=reload_s, deactivation_s=rhythm.return_s, makespan_s=t_now, makespan_more_s=t_more
    )
    return LendOutlook(window, reload_s, rhythm.return_s, t_now, t_more, saving)


def _held(job_ids: list[int]) -> dict[int, int]:
    """Dedicated rollout GPUs each job's live workers hold now (on reserved and elastic nodes: a worker on a
    lent training unit is not the job's share)."""
    out = {j: 0 for j in job_ids}
    for job_id, tp in Worker.objects.filter(
        job_id__in=job_ids, alive=True, zone=Zone.ROLLOUT, node__pool__in=[Pool.RESERVED, Pool.ELASTIC]
    ).values_list("job_id", "job__tp"):
        out[job_id] += tp
    return out


def rebalance(*, reason: str, actor: str = "arbiter") -> Rebalance:
    """Divide the cluster's dedicated rollout GPUs among the pending and running jobs and store the allotments.

    The units are `division_unit`'s (the jobs' common TP, or their TPs' greatest common divisor where they
    differ: each job's allotment is then rounded down to its own TP). The previous division is each job's
    stored allotment (what it holds, if it has none yet), so the arbiter's cost gate and hysteresis see what a
    move would undo."""
    jobs = list(Job.objects.filter(status__in=ARBITRATED).order_by("created", "id"))
    groups = _groups()
    unit_gpus = division_unit(j.tp for j in jobs)
    accepted = {h.lower() for j in jobs for h in j.rollout_hardware}
    capacity = sum(n // unit_gpus for (_, hw), n in groups.items() if hw in accepted)
    capacity_gpus = capacity * unit_gpus
    last = last_division()
    if reason == "capacity change":
        before = last.get("capacity_gpus")
        if isinstance(before, int) and before != capacity_gpus:
            reason = f"capacity {before}→{capacity_gpus} GPUs"
    held = _held([j.pk for j in jobs])
    now_s = time.time()
    lent_before = lends_of([j.pk for j in jobs])
    lending = Lending(jobs, {b for (_, b) in lent_before}, now_s, unit_gpus)
    rhythms = {j.pk: cadence(j) for j in jobs}
    demands = []
    for j in jobs:
        types = {h.lower() for h in j.rollout_hardware}
        own = sum((n // j.tp) * j.tp for (_, hw), n in groups.items() if hw in types) // unit_gpus
        demands.append(_demand(j, unit_gpus, own, lending, rhythms[j.pk]))
    by_id = {j.pk: j for j in jobs}
    by_name = {j.name: j for j in jobs}
    # a job that paused or ended since the last division gave its share back: listed once ('b 2→0'), then 0
    gone = list(
        Job.objects.exclude(status__in=ARBITRATED)
        .filter(allotted_rollout_gpus__gt=0)
        .values_list("pk", "name", "allotted_rollout_gpus")
    )
    prev = Allotment(
        {
            j.name: (j.allotted_rollout_gpus if j.allotted_rollout_gpus is not None else held[j.pk]) // unit_gpus
            for j in jobs
        }
        | {name: (was or 0) // unit_gpus for _, name, was in gone},
        tuple(
            Lend(by_id[o].name, by_id[b].name, g // unit_gpus, math.inf)
            for (o, b), g in sorted(lent_before.items())
            if g // unit_gpus > 0
        ),
    )
    # the lends' clock: each owner's loop seconds from now (`Cadence`), the curves' and costs' clock
    new = arbitrate(capacity, demands, prev, reason=reason, now_s=0.0, config=LIVE_CONFIG)
    borrowers = {lend.borrower for lend in new.lends}

    def _scale(lend: Lend) -> float:  # the owner's loop seconds to wall seconds (its due time, stored)
        rhythm = rhythms[by_name[lend.owner].pk]
        return rhythm.scale if rhythm else 1.0

    lends = {  # a job that borrows in this division lends nothing in it (`Lending`)
        (by_name[lend.owner].pk, by_name[lend.borrower].pk): (lend.units * unit_gpus, now_s + lend.due_s * _scale(lend))
        for lend in new.lends
        if lend.owner not in borrowers
    }
    allotted = {j.pk: new.units.get(j.name, 0) * unit_gpus // j.tp * j.tp for j in jobs}
    changed = [j for j in jobs if j.allotted_rollout_gpus != allotted[j.pk]]
    shrink = [j for j in changed if allotted[j.pk] < (j.allotted_rollout_gpus or held[j.pk])]
    grow = [j for j in changed if j not in shrink]
    explanation = "; ".join(new.explanation)
    idle = {name: str(why) for name, why in new.idle.items()}
    with transaction.atomic():
        for j in changed:
            Job.objects.filter(pk=j.pk).update(allotted_rollout_gpus=allotted[j.pk])
        for j in jobs:  # written only when it changes (whole seconds): the division runs on every cluster event
            why = new.unlent.get(j.name, "")
            if j.unlent_reason != why:
                Job.objects.filter(pk=j.pk).update(unlent_reason=why)
        Job.objects.filter(pk__in=[pk for pk, _, _ in gone]).update(allotted_rollout_gpus=0)
        # the lends: a new one frees the owner's units (its parked overlap workers stop), an ended one's
        # borrower is planned to stop its workers there (services.lending)
        relent = [by_id[b] for b in sorted(store_lends(lends, actor=actor)) if b in by_id]
        lent_now = lends_of([j.pk for j in jobs])
        lent = {j.name: sum(g for (_, b), g in lent_now.items() if b == j.pk) for j in jobs}
        lent = {name: g for name, g in lent.items() if g}
        grow += [j for j in relent if j not in changed]
        waiting = [j for j in jobs if j.status == Job.Status.PENDING and j not in changed + relent]
        order = [(j.pk, _signal(j)) for j in shrink + grow + waiting]
        # a job's reason for having nothing may change with no allotment changing (the capacity went from the
        # others): recorded too, the planner reads it (`idle_reason`)
        if changed or gone or relent or idle != (last.get("idle") or {}):
            units = {name: 0 for _, name, _ in gone} | {j.name: allotted[j.pk] for j in jobs}
            ev = emit(
                kind=EVENT_KIND,
                actor=actor,
                message=(explanation or f"{reason}: allotments set")
                + (f" (units of {unit_gpus} GPUs)" if unit_gpus > 1 else ""),
                data={
                    "reason": reason,
                    "gpus": units,
                    "held": {j.name: held[j.pk] for j in jobs},
                    "lent": lent,
                    "unit_gpus": unit_gpus,
                    "capacity_gpus": capacity_gpus,
                    "idle": idle,
                },
            )
            push_delta_on_commit(  # the cluster page's share chart grows by one point (selectors.jobs.share_history)
                kind="allotment",
                key="cluster",
                data={"t": ev.created.isoformat(), "why": ev.message, "gpus": units, "lent": lent},
            )
    return Rebalance(allotted, order, explanation, unit_gpus, capacity_gpus)


def _signal(job: Job) -> str:
    """A job not placed yet is planned as at its first step's start; a running one as for a capacity change."""
    return "step_start" if job.status == Job.Status.PENDING else "capacity_change"
