"""Cross-job borrowing, live (issue 35): a job's training GPUs idle between its updates serve another job's
rollout until the owner's next Training Begin, as the simulator's `pearl` sharing lends them.

A training unit (one `tp` group of the owner's training GPUs) hosts its training worker and one rollout worker:
normally the owner's own overlap worker, asleep while the trainer computes and lent to the owner's own rollout
between updates (intra-job borrowing). The cluster arbiter (`services.arbitration`) may lend an idle unit to
another job instead. The lend is a `TrainingLend` row; the owner's parked overlap worker on the unit stops (it
is asleep: it holds no work) and the borrower's planner starts a worker of its own there, for its placement a
dedicated rollout worker that may have to leave (`planner.job_inventory`, `selectors.lending.borrowed_units`).
The owner's Training Begin takes it back as it takes its own overlap workers back (`workers.return_borrowed`:
the agent aborts its in-flight turns, whose callers resume them elsewhere, and parks it); the owner's update
waits for it (`selectors.driver.not_returned`); the next division ends the lend, the borrower's planner stops
its worker there, and the owner's next plan starts its overlap worker again (`restore_overlap`).

A lend moves whole training units of the owner holding whole workers of the borrower (`core.arbiter.lend_step`):
a TP2 job's unit holds two workers of a TP1 job, two TP1 units side by side on one node one TP2 worker; jobs
whose TPs do not divide lend nothing to each other. Kept simple on purpose: lends go to a job that
accepts the owner's chip type; a job lends or borrows in one division, never both (no two jobs wait on each
other's Training Begin); a job lends only once it has begun training twice (its next Training Begin is
predicted from their interval, `selectors.lending.cadence`). The job's status and page say which of these
stops it (`selectors.lending.lend_refusal`, the arbiter's own test) or, where none does, what the closest lend
would have saved and cost in the last division (`core.arbiter.Allotment.unlent`, kept as `Job.unlent_reason`).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

from controlplane.core.state import Activity, Role
from controlplane.models import Job, TrainingLend
from controlplane.selectors.lending import claims, in_transition, lend_gpus, promised_units, training_units
from controlplane.services.locks import lock_job
from controlplane.services.workers import start_worker, stop_workers


def store_lends(new: dict[tuple[int, int], tuple[int, float]], *, actor: str) -> set[int]:
    """Make the stored lends `new` ((owner id, borrower id) -> (GPUs, due epoch s)). A lend that grows first
    frees the owner's units (its parked overlap workers stop) as far as the owner can still lend (it may have
    begun training since the division, or lent a unit to its own rollout): the lend is then what it freed.
    Lends not in `new` end. Returns the ids of the borrowers whose lend changed (to be planned)."""
    changed: set[int] = set()
    for pk, o, b in TrainingLend.objects.values_list("pk", "owner_id", "borrower_id"):
        if new.get((o, b), (0, 0.0))[0] <= 0:
            TrainingLend.objects.filter(pk=pk).delete()
            changed.add(b)
    tps = dict(Job.objects.filter(pk__in={j for pair in new for j in pair}).values_list("pk", "tp"))
    for (owner_id, borrower_id), (gpus, due_s) in sorted(new.items()):
        if gpus <= 0:
            continue
        owner = lock_job(owner_id)  # serialises with the owner's planner and its Training Begin
        row = TrainingLend.objects.filter(owner_id=owner_id, borrower_id=borrower_id).first()
        had = row.gpus if row else 0
        if gpus > had:  # in whole training units of the owner holding whole workers of the borrower
            step = lend_gpus(owner.tp, tps.get(borrower_id, 1))
            freed = _free_for_lend(owner, (gpus - had) // step * step // max(1, owner.tp), actor)
            gpus = had + freed * max(1, owner.tp) // step * step
        due = datetime.fromtimestamp(due_s, tz=UTC) if math.isfinite(due_s) else None
        if gpus <= 0:
            continue
        if row is None:
            TrainingLend.objects.create(owner_id=owner_id, borrower_id=borrower_id, gpus=gpus, due=due)
        elif (row.gpus, row.due) != (gpus, due):
            TrainingLend.objects.filter(pk=row.pk).update(gpus=gpus, due=due)
        if gpus != had:
            changed.add(borrower_id)
    return changed


def _free_for_lend(owner: Job, units: int, actor: str) -> int:
    """Free `units` more of the owner's training units for a lend: empty ones no other lend holds first, then
    its parked overlap workers stop. Returns how many it freed (none once its trainer computes)."""
    if owner.training_active or units <= 0:
        return 0
    mine = training_units(owner)
    lent_out = sum(1 for u in mine if u.occupant_job not in (None, owner.pk))
    empty = sum(1 for u in mine if u.occupant_job is None)
    take = min(units, max(0, empty - max(0, promised_units(owner) - lent_out)))
    busy = in_transition(owner)
    parked = [
        u.occupant_slot
        for u in reversed(mine)
        if u.occupant_job == owner.pk
        and u.occupant_activity == Activity.INACTIVE
        and u.occupant_slot is not None
        and u.occupant_slot not in busy
    ][: units - take]
    if parked:
        stop_workers(job_id=owner.pk, slots=parked, actor=actor)
    return take + len(parked)


def restore_overlap(owner: Job, *, actor: str = "planner") -> int:
    """The owner's overlap workers on units no lend holds any more (a lend that ended left them empty): started
    again, asleep. Not while its trainer computes. Returns how many it started."""
    if owner.training_active:
        return 0
    mine = training_units(owner, claims())
    lent_out = sum(1 for u in mine if u.occupant_job not in (None, owner.pk))
    empty = [u for u in mine if u.occupant_job is None]
    keep = max(0, promised_units(owner) - lent_out)  # empty units a borrower is still to take: the first ones
    for u in empty[keep:]:
        start_worker(
            job_id=owner.pk,
            node_id=u.node_id,
            gpu_indexes=list(u.gpus),
            role=Role.COLOCATED,
            activity=Activity.INACTIVE,
            actor=actor,
        )
    return len(empty[keep:])
