"""The cluster arbiter (issue 35): several RL jobs share one cluster's rollout units.

On every capacity change, job arrival, job end and training phase change the arbiter divides the dedicated
rollout units (reserved + preemptible) among the running jobs, and lends the training units a job leaves idle
between its updates to the other jobs' rollout. Each job's own PEARL decision (mode, P:D ratio, its own
borrowing) then runs inside its allotment, unchanged.

Pearl's division (`arbitrate`), in order:
1. what the jobs held is kept (a unit that moves costs a weight reload and lost KV caches), capped by each
   job's maximum; when the pool shrank, the units whose loss costs least go first;
2. guarantees (`min_units`) by priority: free units first, then units of lower-priority jobs (never below
   their own guarantee);
3. free units one at a time to the job whose weighted predicted step time the next unit shortens most:
   benefit = weight · ln(T(n) / T(n+1)) (proportional fairness: equal weights and equal curves give equal
   shares; a job's first unit is worth infinitely much, so no running job starves; read past a flat stretch of
   T, `_Curve`), a job below its weighted fair share of the pool served first;
4. moves between jobs only where the receiver's benefit beats the donor's loss by the hysteresis margin plus
   the move's cost (the receiver's weight reload, the donor's lost KV caches, each as a fraction of a step,
   paid back over `payback_steps` steps); a job below its fair share needs only to pay for the move, over
   `fair_payback_steps`; a job at or below its own share gives only units it gains nothing from. So
   allotments do not flap: no move is worth undoing;
5. cross-job borrowing: a job's idle training units are lent to another job's rollout only when the lend pays
   for its reload within the window before the owner's Training Begin (the deadline accounting of intra-job
   borrowing, `core.borrowing.return_deadline`); they are returned at that Training Begin.

The baselines the simulator compares it with are in `core.sharing`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from controlplane.core.borrowing import return_deadline


class Idle(StrEnum):
    """Why the arbiter allots a running job no unit (`Allotment.idle`): whether its workers should give way."""

    NO_CAPACITY = "no capacity"  # the pool has no unit (nodes gone, leases lapsed): nothing went to anyone
    NO_UNITS = "no unit it can use"  # its maximum is 0 units (none of its chip types in the pool, or < one unit)
    ELSEWHERE = "other jobs hold every unit"  # guarantees, priorities and shares gave the units to other jobs


INFEASIBLE_S = 1e7  # the price of a job size the predictor rejects, over n (see `_Curve._raw`)
LOOKAHEAD_UNITS = 4  # a unit's benefit is the best mean over the next 1..4 units (see `_Curve.benefit`)
StepCurve = Callable[[int], float]  # predicted step time (s) of a job with n rollout units; inf at n = 0


@dataclass(frozen=True, slots=True)
class JobDemand:
    """What the arbiter knows of one running job."""

    name: str
    max_units: int  # rollout_gpus / tp: never more
    step_time: StepCurve  # from the job's own predictor
    priority: int = 0  # higher is served first
    weight: float = 1.0  # the fair share among equal priorities
    min_units: int = 0  # guaranteed while it runs
    arrival_s: float = 0.0  # order of arrival (fcfs; ties)
    training: bool = False  # its trainer is computing: its training units are busy
    lendable_units: int = 0  # its training units idle now and not borrowed by itself
    # units of one lend larger than its own worker (a TP2 borrower's of a TP1 owner) -> how many such groups its
    # idle training units make side by side on one node; a size not here: as many as its idle units make
    lendable_groups: Mapping[int, int] = field(default_factory=dict)
    training_begin_s: float = math.inf  # predicted time of its next Training Begin (lent units are due then)
    reload_s: float = 0.0  # a unit joining it loads its model's weights this long
    kv_loss_s: float = 0.0  # a unit leaving it costs this much of its step (KV caches lost, re-prefill)
    deactivation_s: float = 0.0  # a lent unit takes this long to stop serving the borrower
    outstanding: int = 0  # unfinished trajectories × tp (RLix's demand)
    # the units one worker of it takes (its TP over the division's unit: 1 where every job has one TP); its
    # training units are this size too, so a lend between two jobs moves whole workers of both
    worker_units: int = 1
    # its predictor has measured it (`FittedProfile.measured`); until then `step_time` is its prior's, which can
    # be off by several times (a 2,048-trajectory job's prior: 127 s at 2 units where its rollout took 766 s),
    # so its fair share is not taken on the prior's word that it gains nothing from it
    measured: bool = True

    def __post_init__(self) -> None:
        if self.max_units < 0 or self.min_units < 0 or self.worker_units < 1:
            raise ValueError(f"job {self.name}: unit counts must be >= 0 (a worker's >= 1)")
        if any(size < 1 or n < 0 for size, n in self.lendable_groups.items()):
            raise ValueError(f"job {self.name}: lendable groups are sizes >= 1 and counts >= 0")
        if not self.weight > 0:
            raise ValueError(f"job {self.name}: weight must be > 0")


@dataclass(frozen=True, slots=True)
class Lend:
    """Training units of `owner` serving `borrower`'s rollout until the owner's Training Begin."""

    owner: str
    borrower: str
    units: int
    due_s: float  # the owner's predicted Training Begin: back by then


@dataclass(frozen=True, slots=True)
class ArbiterConfig:
    # a move between jobs must gain this much weighted ln(step time) beyond its cost (hysteresis)
    hysteresis: float = 0.03
    # a move's one-time cost (reload, lost KV) is paid back over this many of the receiver's steps...
    payback_steps: float = 4.0
    # ...or over this many when it brings a job below its fair share back towards it (it keeps that share for
    # the rest of its run, and such a move is never undone: the donor stays at or above its own share)
    fair_payback_steps: float = 20.0
    return_margin_s: float = 5.0  # lent units are due this long before the owner's Training Begin
    min_benefit: float = 1e-3  # a unit that shortens a step by less than 0.1% is not worth giving
    lending: bool = True  # cross-job borrowing of idle training units


@dataclass(frozen=True, slots=True)
class Allotment:
    """The division: dedicated units per job, lends of training units, and why it changed."""

    units: Mapping[str, int]
    lends: tuple[Lend, ...] = ()
    explanation: tuple[str, ...] = ()
    predicted_gain: float = 0.0  # weighted ln(step time) the changes are predicted to save
    idle: Mapping[str, Idle] = field(default_factory=dict)  # why each job allotted nothing has nothing
    unlent: Mapping[str, str] = field(default_factory=dict)  # why a job with idle training units lends none

    def borrowed(self, job: str) -> int:
        return sum(lend.units for lend in self.lends if lend.borrower == job)

    def lent(self, job: str) -> int:
        return sum(lend.units for lend in self.lends if lend.owner == job)

    def total(self, job: str) -> int:
        """The rollout units `job` serves on: its dedicated units plus those lent to it."""
        return self.units.get(job, 0) + self.borrowed(job)

    @property
    def changed(self) -> bool:
        return bool(self.explanation)


@dataclass(slots=True)
class _Curve:
    """A job's step-time curve, evaluated lazily and memoised (the arbiter asks only near its allotment).

    Two repairs of the predictor's raw curve, which is jagged in n (its fit, and the mode and P:D ratio it
    picks at each size; with units of one GPU, a TP2 job's odd sizes buy nothing): `at` never rises with n (a
    unit a job cannot use stands idle, so n + 1 units are never slower than n), and `benefit` looks past a
    flat stretch (a job whose next unit buys nothing but whose next two buy much is not passed over)."""

    job: JobDemand
    memo: dict[int, float] = field(default_factory=dict)
    filled: int = 0  # memo holds every size 1..filled

    def _raw(self, n: int) -> float:
        """The predictor's T(n); a size it rejects (the batch's KV does not fit) is priced INFEASIBLE_S / n, so
        a unit still counts there: it brings the job nearer to a size that runs."""
        v = float(self.job.step_time(n))
        return v if math.isfinite(v) else INFEASIBLE_S / n

    def at(self, n: int) -> float:
        """T(n): the best predicted step time with at most n units."""
        if n <= 0:
            return math.inf
        if n > self.filled:
            best = self.memo[self.filled] if self.filled else math.inf
            for k in range(self.filled + 1, n + 1):
                best = min(best, self._raw(k))
                self.memo[k] = best
            self.filled = n
        return self.memo[n]

    def benefit(self, n: int) -> float:
        """What the (n+1)-th unit is worth (inf for the first): weighted ln(T(n)/T(n+k)) / k, the best k up to
        LOOKAHEAD_UNITS (never past the job's maximum)."""
        if n < 0:
            return 0.0
        a = self.at(n)
        best = 0.0
        for k in range(1, min(LOOKAHEAD_UNITS, self.job.max_units - n) + 1):
            b = self.at(n + k)
            if not math.isfinite(b):
                continue
            if not math.isfinite(a):
                return math.inf
            if b > 0:
                best = max(best, self.job.weight * math.log(a / b) / k)
        return best


def fair_shares(total: int, jobs: Sequence[JobDemand]) -> dict[str, int]:
    """Weighted water-filling of `total` units, each job capped at its maximum (integer, stable order)."""
    share = {j.name: 0 for j in jobs}
    open_ = [j for j in jobs if j.max_units > 0]
    left = total
    while left > 0 and open_:
        wsum = sum(j.weight for j in open_)
        give = {j.name: min(j.max_units - share[j.name], int(left * j.weight / wsum)) for j in open_}
        if not any(give.values()):
            # fewer units than jobs: one each, by priority, weight, then arrival
            for j in sorted(open_, key=lambda j: (-j.priority, -j.weight, j.arrival_s, j.name)):
                if left == 0:
                    break
                share[j.name] += 1
                left -= 1
        else:
            for j in open_:
                share[j.name] += give[j.name]
                left -= give[j.name]
        open_ = [j for j in open_ if share[j.name] < j.max_units]
    return share


def _order(j: JobDemand) -> tuple[int, float, str]:
    return (-j.priority, j.arrival_s, j.name)


def arbitrate(
    capacity: int,
    jobs: Sequence[JobDemand],
    previous: Allotment | None = None,
    *,
    reason: str = "",
    now_s: float = 0.0,
    config: ArbiterConfig = ArbiterConfig(),
) -> Allotment:
    """Divide `capacity` dedicated rollout units among the running `jobs` (and lend idle training units)."""
    prev = previous.units if previous is not None else {}
    curves = {j.name: _Curve(j) for j in jobs}
    by = {j.name: j for j in jobs}
    deserved = fair_shares(capacity, jobs)
    alloc = {j.name: min(prev.get(j.name, 0), j.max_units) for j in jobs}
    notes: list[str] = []

    def loss(name: str) -> float:
        return curves[name].benefit(alloc[name] - 1)

    # 1. the pool shrank: the cheapest losses go first (above guarantees first, lowest priority first)
    excess = sum(alloc.values()) - capacity
    while excess > 0:
        cands = [n for n in alloc if alloc[n] > 0]
        victim = min(
            cands,
            key=lambda n: (alloc[n] <= by[n].min_units, by[n].priority, alloc[n] <= deserved[n], loss(n)),
        )
        alloc[victim] -= 1
        excess -= 1
    free = capacity - sum(alloc.values())
    # 2. guarantees by priority: free units first, then lower-priority jobs above their own guarantee
    for j in sorted(jobs, key=_order):
        need = min(j.min_units, j.max_units) - alloc[j.name]
        while need > 0:
            if free > 0:
                free -= 1
            else:
                donors = [
                    n for n in alloc if n != j.name and alloc[n] > by[n].min_units and by[n].priority < j.priority
                ]
                donors = donors or [n for n in alloc if n != j.name and alloc[n] > by[n].min_units]
                if not donors:
                    notes.append(f"{j.name}'s guarantee of {j.min_units} units cannot be met ({alloc[j.name]})")
                    break
                d = min(donors, key=lambda n: (by[n].priority, loss(n)))
                alloc[d] -= 1
            alloc[j.name] += 1
            need -= 1

    # 3. free units by weighted marginal benefit, jobs below their fair share first
    def receive_key(name: str) -> tuple[int, float, int, float]:
        b = curves[name].benefit(alloc[name])
        below = alloc[name] < deserved[name] and (b > config.min_benefit or not by[name].measured)
        return (int(below), b, by[name].priority, -by[name].arrival_s)

    heap = [(_neg(receive_key(n)), n) for n in alloc if alloc[n] < by[n].max_units]
    heapq.heapify(heap)
    while free > 0 and heap:
        key, n = heapq.heappop(heap)
        if _neg(key) != receive_key(n) or alloc[n] >= by[n].max_units:
            if alloc[n] < by[n].max_units:
                heapq.heappush(heap, (_neg(receive_key(n)), n))
            continue
        if not key[0] and key[1] > -config.min_benefit:  # the best remaining unit is worth nothing
            break
        alloc[n] += 1
        free -= 1
        if alloc[n] < by[n].max_units:
            heapq.heappush(heap, (_neg(receive_key(n)), n))
    # units no job gains from are not left idle: by fair share, then arrival (a later arrival or a changed
    # curve will claim them; until then they serve)
    while free > 0:
        open_ = [j for j in jobs if alloc[j.name] < j.max_units]
        if not open_:
            break
        j = min(open_, key=lambda j: (alloc[j.name] / j.weight, j.arrival_s, j.name))
        alloc[j.name] += 1
        free -= 1
    # 4. moves between jobs, gated by cost and hysteresis (each move strictly improves: it terminates)
    gain_total = 0.0
    for _ in range(capacity + 1):
        recv = [n for n in alloc if alloc[n] < by[n].max_units]
        if not recv:
            break
        r = max(recv, key=receive_key)
        rk = receive_key(r)
        donors = [n for n in alloc if n != r and alloc[n] > by[n].min_units]
        if not donors:
            break

        def donate_key(n: str) -> tuple[int, float]:
            # a job at or below its fair share keeps it, but not the units it gains nothing from (its trainer
            # bounds its step): those are not a share it uses, and it gets them back once they are worth something.
            # A job its predictor has not measured yet keeps its share whatever its prior says
            keeps = loss(n) > config.min_benefit or not by[n].measured
            return (int(alloc[n] <= deserved[n] and keeps), loss(n))

        d = min(donors, key=donate_key)
        dk = donate_key(d)
        if rk[0] < dk[0]:
            break
        cr, cd = curves[r], curves[d]
        fair = rk[0] > dk[0]
        cost = (
            by[r].weight * by[r].reload_s / max(cr.at(alloc[r] + 1), 1e-9)
            + by[d].weight * by[d].kv_loss_s / max(cd.at(alloc[d] - 1), 1e-9)
        ) / (config.fair_payback_steps if fair else config.payback_steps)
        net = rk[1] - cost if fair else rk[1] - dk[1] - cost
        if not net > config.hysteresis:
            break
        alloc[r] += 1
        alloc[d] -= 1
        gain_total += net
    lends, unlent = _lend(jobs, alloc, curves, previous, now_s, config) if config.lending else ((), {})
    idle = {j.name: _idle(capacity, j) for j in jobs if alloc[j.name] == 0}
    out = Allotment(dict(alloc), lends, (), gain_total)
    return Allotment(out.units, lends, tuple(notes) + explain(reason, previous, out, jobs), gain_total, idle, unlent)


def _idle(capacity: int, job: JobDemand) -> Idle:
    if capacity <= 0:
        return Idle.NO_CAPACITY
    return Idle.NO_UNITS if job.max_units <= 0 else Idle.ELSEWHERE


def _neg(k: tuple[int, float, int, float]) -> tuple[int, float, int, float]:
    return (-k[0], -k[1], -k[2], -k[3])


def lend_saving(
    *, window_s: float, reload_s: float, deactivation_s: float, makespan_s: float, makespan_more_s: float
) -> float:
    """What one more unit lent for `window_s` (until the return must start, before the owner's Training Begin)
    saves the borrower, net of its T_toggle (Eq. 7: the borrower's reload, the owner's deactivation): the
    makespan it cuts (`makespan_s` at the borrower's units now, `makespan_more_s` with one more), in the part
    of the step the unit serves after its reload. -inf where the lend does not pay.

    The reload counts twice, in the window and in the toggle, on purpose: the simulator measured a gate that
    paid it once lending 2.3x the GPU-seconds (multi-8jobs) and doing worse (pearl / static 0.977 -> 0.955 on
    multi-4jobs, 1.022 -> 0.999 on multi-2jobs-paper-seg2, the rest within 0.003): a lend costs more than its
    reload (the turns it holds at the return resume elsewhere with their prefill; the owner's return)."""
    saved, toggle = lend_terms(
        window_s=window_s,
        reload_s=reload_s,
        deactivation_s=deactivation_s,
        makespan_s=makespan_s,
        makespan_more_s=makespan_more_s,
    )
    return saved - toggle if saved > toggle else -math.inf


def lend_terms(
    *, window_s: float, reload_s: float, deactivation_s: float, makespan_s: float, makespan_more_s: float
) -> tuple[float, float]:
    """`lend_saving`'s two sides, (what the lent unit saves, its T_toggle), for a job's status to say why a lend
    does not pay: the saving is 0 where the window ends before the reload does."""
    window = window_s - reload_s
    if window <= 0 or not math.isfinite(makespan_more_s):
        saved = 0.0
    elif math.isfinite(makespan_s):
        saved = (makespan_s - makespan_more_s) * min(1.0, window / makespan_s)
    else:
        saved = window
    return saved, reload_s + deactivation_s


def _lend(
    jobs: Sequence[JobDemand],
    alloc: Mapping[str, int],
    curves: Mapping[str, _Curve],
    previous: Allotment | None,
    now_s: float,
    config: ArbiterConfig,
) -> tuple[tuple[Lend, ...], dict[str, str]]:
    """Idle training units to other jobs' rollout: a lend must pay for the borrower's reload within the
    window before the owner's Training Begin (less the deactivation and the margin), as Eq. 7 gates a borrow.
    Also, per owner with idle units that lends none, why (`_why_unlent`)."""
    by = {j.name: j for j in jobs}
    extra = {j.name: 0 for j in jobs}
    lends: dict[tuple[str, str], int] = {}
    unlent: dict[str, str] = {}
    kept = {(lend.owner, lend.borrower): lend.units for lend in (previous.lends if previous else ())}
    owners = sorted((j for j in jobs if not j.training and j.lendable_units > 0), key=lambda j: -j.training_begin_s)

    # where placement is known: the larger borrowers' groups the owner's idle units still make side by side
    groups = {o.name: dict(o.lendable_groups) for o in owners}

    def admits(owner: JobDemand, b: JobDemand, sticky: bool, left: int) -> float:
        n, step = _whole(alloc[b.name], b) + extra[b.name], lend_step(owner, b)
        if n + step > b.max_units or step > left or not _placed(owner, step, groups[owner.name]):
            return -math.inf
        c = curves[b.name]
        net = lend_saving(
            window_s=_lend_window(owner, now_s, config),
            reload_s=0.0 if sticky else b.reload_s,
            deactivation_s=owner.deactivation_s,
            makespan_s=c.at(n),
            makespan_more_s=c.at(n + step),
        )
        return b.weight * net if net > 0 else -math.inf

    def give(owner: str, b: JobDemand) -> int:
        step = lend_step(by[owner], b)
        lends[(owner, b.name)] = lends.get((owner, b.name), 0) + step
        extra[b.name] += step
        counts = groups[owner]
        for size in counts:  # the units it takes leave fewer groups of each size (it splits one, at worst)
            counts[size] = max(0, counts[size] - -(-step // size))
        return step

    for owner in owners:
        left = owner.lendable_units
        # keep what was lent before first (a returned and re-lent unit reloads its weights)
        for (o, bname), k in sorted(kept.items()):
            if o != owner.name or bname not in by or bname == owner.name:
                continue
            while k > 0 and admits(owner, by[bname], True, left) > 0:
                step = give(o, by[bname])
                left -= step
                k -= step
        while left > 0:
            scored = [(admits(owner, b, False, left), b.name) for b in jobs if b.name != owner.name]
            scored = [s for s in scored if s[0] > 0]
            if not scored:
                break
            _, bname = max(scored)
            left -= give(owner.name, by[bname])
        if left == owner.lendable_units:
            unlent[owner.name] = _why_unlent(
                owner, [b for b in jobs if b.name != owner.name], alloc, curves, now_s, config
            )
    return tuple(Lend(o, b, k, by[o].training_begin_s) for (o, b), k in sorted(lends.items())), unlent


def division_unit(tps: Iterable[int]) -> int:
    """The GPUs of one arbiter unit for jobs of these TPs: their greatest common divisor (their one TP where
    they share it; one GPU for TP1 beside TP2, two for TP2 beside TP4), so every job's worker is whole units.
    A job's curve then prices units its workers cannot fill as idle (`_Curve`), and a lend moves whole workers
    of both jobs (`lend_step`)."""
    return math.gcd(*(max(1, t) for t in tps)) or 1


def lend_step(owner: JobDemand, borrower: JobDemand) -> int:
    """The units a lend from `owner` to `borrower` moves at a time: whole training units of the owner that hold
    whole workers of the borrower (a TP1 job's worker takes half a TP2 job's training unit, a TP2 worker two of a
    TP1 job's), the least common multiple of their workers' sizes."""
    return math.lcm(owner.worker_units, borrower.worker_units)


def _placed(owner: JobDemand, step: int, groups: Mapping[int, int]) -> bool:
    """Whether a lend of `step` units finds them where its workers fit: the owner's own units each hold whole
    workers of a borrower no larger; a larger borrower's worker needs `step` units side by side on one node, of
    which `groups` counts those left (a size it does not list: placement unknown, any `step` idle units do)."""
    return step <= owner.worker_units or groups.get(step, 1) > 0


def _whole(units: int, job: JobDemand) -> int:
    """The units of `units` the job's workers can use (a TP2 job's odd GPU holds none): a lend adds to these."""
    return units // job.worker_units * job.worker_units


def _lend_window(owner: JobDemand, now_s: float, config: ArbiterConfig) -> float:
    """Seconds from now until a unit lent by `owner` must start its return (before its Training Begin)."""
    dl = return_deadline(
        training_begin_s=owner.training_begin_s,
        deactivation_s=owner.deactivation_s,
        now_s=now_s,
        margin_s=config.return_margin_s,
    )
    return dl.start_by_s - now_s


def _why_unlent(
    owner: JobDemand,
    others: Sequence[JobDemand],
    alloc: Mapping[str, int],
    curves: Mapping[str, _Curve],
    now_s: float,
    config: ArbiterConfig,
) -> str:
    """Why none of the owner's idle training units went to another job, the closest job first (whole seconds:
    a job's status reads it, and it changes only when the reason does)."""
    window = _lend_window(owner, now_s, config)
    full: list[str] = []
    weighed: list[tuple[float, str]] = []
    for b in others:
        n, step = _whole(alloc[b.name], b), lend_step(owner, b)
        if n + step > b.max_units:
            full.append(b.name)
            continue
        if step > owner.lendable_units:
            weighed.append(
                (
                    -math.inf,
                    f"{b.name}'s workers need {step} of its units on one lend, it has {owner.lendable_units} idle",
                )
            )
            continue
        if not _placed(owner, step, owner.lendable_groups):
            weighed.append(
                (
                    -math.inf,
                    f"{b.name}'s workers need {step} of its units side by side on one node; its "
                    f"{owner.lendable_units} idle ones are not",
                )
            )
            continue
        saved, toggle = lend_terms(
            window_s=window,
            reload_s=b.reload_s,
            deactivation_s=owner.deactivation_s,
            makespan_s=curves[b.name].at(n),
            makespan_more_s=curves[b.name].at(n + step),
        )
        weighed.append(
            (
                saved - toggle,
                f"{b.name} would save {saved:.0f} s of its step before the return, less than the "
                f"{toggle:.0f} s the lend costs ({b.reload_s:.0f} s {b.name}'s reload, {owner.deactivation_s:.0f} s "
                "the return)",
            )
        )
    parts = [why for _, why in sorted(weighed, key=lambda w: -w[0])[:2]]
    if full:
        parts.append(f"{', '.join(sorted(full))} at {'its' if len(full) == 1 else 'their'} maximum")
    if not parts:
        return ""
    return f"no lend pays in the {max(0.0, window):.0f} s before its return must start: " + "; ".join(parts)


def explain(reason: str, previous: Allotment | None, new: Allotment, jobs: Sequence[JobDemand]) -> tuple[str, ...]:
    """'job B arrived: A 6→4, B 0→2' (units each job serves on; '+k lent' where some are another job's
    training units). Empty when nothing changed."""
    names = [j.name for j in sorted(jobs, key=lambda j: (j.arrival_s, j.name))]
    gone = sorted(set(previous.units) - set(names)) if previous is not None else []
    parts: list[str] = []
    for n in gone + names:
        a = previous.total(n) if previous is not None else 0
        b = new.total(n)
        la = previous.borrowed(n) if previous is not None else 0
        lb = new.borrowed(n)
        if a != b or la != lb:
            parts.append(f"{n} {a}→{b}" + (f" (+{lb} lent)" if lb else ""))
    if not parts:
        return ()
    return (f"{reason}: {', '.join(parts)}" if reason else ", ".join(parts),)


__all__ = [
    "Allotment",
    "ArbiterConfig",
    "Idle",
    "JobDemand",
    "Lend",
    "StepCurve",
    "arbitrate",
    "division_unit",
    "explain",
    "fair_shares",
    "lend_saving",
]
