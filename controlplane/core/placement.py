"""Worker placement: inventory + policy action → joins, borrows, returns, departures → one transition plan.

The one function between "what the cluster has" and "what changes" (paper §2 ① budget → ② decide →
③ plan): the live planner builds the `Inventory` from the database, the simulator from its world,
and both call `place()`. Units are TP groups of GPUs. A dedicated unit (reserved or elastic pool)
either hosts a rollout worker or is free; an overlap unit (training pool) always hosts an overlap
rollout worker next to its training worker, borrowed (has a role) or not.

Rules (why):
- units that must go (node not ready, draining, preempted, elasticity off) leave first and are never kept;
- in-service workers are kept before idle or free units (stable slots: survivors are never
  renumbered), reserved before elastic (elastic GPUs may be preempted), then in a stable order;
- the policy's target is fitted to what exists (it never asks the executor for workers it cannot
  have); borrowed overlap workers are kept before new ones are borrowed;
- a free unit joins as a new worker on the lowest free slot id (new workers reuse empty slots).
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from controlplane.core.context import AvailabilityPoint, Overrides, PolicyContext, Signal
from controlplane.core.policies import Policy, PolicyAction
from controlplane.core.state import Configuration, Mode, Pool, Role
from controlplane.core.transitions import Step, StepKind, TransitionPlan, plan_transition


@dataclass(frozen=True, slots=True)
class Unit:
    """A TP group of GPUs that can host one rollout worker."""

    key: Hashable  # the caller's handle (simulator: unit id; live: (node id, GPU indexes))
    pool: Pool  # RESERVED | ELASTIC (dedicated) or TRAINING (overlap)
    worker: int | None = None  # worker slot bound to it (None: a free dedicated GPU group)
    role: Role | None = None  # the worker's role once in-flight transitions complete (None: not serving)
    leaving: bool = False  # must go now (node not ready, draining, preempted, elasticity off)
    busy: bool = False  # mid-transition (activating, draining): ranked after settled workers
    inflight: int = 0  # requests on the worker (survivor tie-break)
    # its chip type ("" = the job's one hardware). A unit is a TP group on one node and a node has one chip
    # type, so a TP group never mixes types.
    hardware: str = ""

    @property
    def overlap(self) -> bool:
        return self.pool is Pool.TRAINING

    @property
    def in_service(self) -> bool:
        return self.worker is not None and self.role is not None


@dataclass(frozen=True, slots=True)
class Inventory:
    units: tuple[Unit, ...]
    taken_slots: frozenset[int] = frozenset()  # worker slots held by others (training workers)
    rollout_cap: int | None = None  # at most this many dedicated workers (None: every unit)
    training_active: bool = False  # the trainer is computing: nothing may be borrowed
    # overlap workers that Training Begin took back just before this plan (the return does not wait for
    # a plan: it is due by the deadline); the policy still learns that borrowing ran into Training Begin
    returned: int = 0

    @property
    def typed(self) -> bool:
        """Its units name their chip types (a mixed pool, issue 23); else one hardware, as before."""
        return any(u.hardware for u in self.units)

    def current(self) -> Configuration | None:
        """The configuration served once in-flight transitions complete (leaving units excluded); on a typed
        pool it names the chip types (`typed_configuration_of`)."""
        serving = [u for u in self.units if u.in_service and not u.leaving]
        if self.typed:
            return typed_configuration_of(serving)
        return configuration_of(u.role for u in serving)


@dataclass(frozen=True, slots=True)
class Placement:
    context: PolicyContext
    action: PolicyAction
    current: Configuration | None
    target: Configuration  # the action's target fitted to the units that exist
    borrow: int  # overlap workers in the target
    plan: TransitionPlan
    new_workers: dict[int, Unit] = field(default_factory=dict)  # new worker slot -> the free unit it starts on
    budget: dict[str, object] = field(default_factory=dict)  # what the decision saw (recorded with it)

    @property
    def changes(self) -> bool:
        return not self.plan.empty


def configuration_of(roles: object) -> Configuration | None:
    """Role multiset → Configuration (None when it is not a valid all-colocated / all-disaggregated set)."""
    p = d = c = 0
    for r in roles:  # type: ignore[attr-defined]
        if r is Role.PREFILL:
            p += 1
        elif r is Role.DECODE:
            d += 1
        elif r is Role.COLOCATED:
            c += 1
    if c and not p and not d:
        return Configuration.colocated(c)
    if p and d and not c:
        return Configuration.disaggregated(p, d)
    return None


def typed_configuration_of(units: Sequence[Unit]) -> Configuration | None:
    """In-service units with their chip types → the typed configuration they serve: '8C(H20+H800)',
    '3P5D(H20)', '3P(H800) 5D(H20)'. None when it is no valid configuration, or prefill (decode) workers
    span several types (no candidate the decision makes has that shape)."""
    cfg = configuration_of(u.role for u in units)
    if cfg is None:
        return None
    if cfg.mode is Mode.COLOCATED:
        return Configuration.colocated(cfg.n_colocated, "+".join(sorted({u.hardware for u in units})))
    pre = {u.hardware for u in units if u.role is Role.PREFILL}
    dec = {u.hardware for u in units if u.role is Role.DECODE}
    if len(pre) != 1 or len(dec) != 1:
        return None
    return Configuration.disaggregated(cfg.n_prefill, cfg.n_decode, pre.pop(), dec.pop())


def fit(target: Configuration, total: int) -> Configuration:
    """Scale a target onto `total` workers (the executor never exceeds what exists)."""
    if target.total == total:
        return target
    if target.mode is Mode.COLOCATED or total < 2:
        return Configuration.colocated(total)
    p = max(1, min(total - 1, round(target.n_prefill * total / max(1, target.total))))
    return Configuration.disaggregated(p, total - p)


def lowest_free_slots(n: int, used: set[int]) -> list[int]:
    """The `n` lowest worker slot ids not in `used` (new workers reuse empty slots)."""
    out: list[int] = []
    s = 0
    while len(out) < n:
        if s not in used:
            out.append(s)
        s += 1
    return out


def place(
    inv: Inventory,
    policy: Policy,
    *,
    signal: Signal,
    now_s: float,
    batch_size: int,
    remaining: int,
    overrides: Overrides = Overrides(),
    future: Sequence[AvailabilityPoint] = (),
) -> Placement:
    """① budget → ② the policy's action → ③ the minimal-change plan over concrete workers."""
    dedicated = [u for u in inv.units if not u.overlap]
    overlap = [u for u in inv.units if u.overlap]
    elastic_ok = overrides.elasticity
    leaving = [u for u in dedicated if u.leaving or (not elastic_ok and u.pool is Pool.ELASTIC)]
    leaving_keys = {u.key for u in leaving}
    # ① budget: dedicated candidates in keep-first order; the cap bounds them
    cand = sorted(
        (u for u in dedicated if u.key not in leaving_keys),
        key=lambda u: (
            0 if u.in_service and not u.busy else 1 if u.in_service else 2,
            u.pool is not Pool.RESERVED,
            u.worker if u.worker is not None else 1 << 40,
        ),
    )
    if inv.rollout_cap is not None:
        cand = cand[: max(0, inv.rollout_cap)]
    ovl = sorted(
        (u for u in overlap if not u.leaving),
        key=lambda u: (
            0 if u.in_service and not u.busy else 1 if u.in_service else 2,
            u.worker if u.worker is not None else 1 << 40,
        ),
    )
    borrowed = [u for u in overlap if u.in_service]
    current = inv.current()
    typed = inv.typed
    ctx = PolicyContext(
        now_s=now_s,
        signal=signal,
        dedicated_workers=len(cand),
        reserved_workers=sum(1 for u in cand if u.pool is Pool.RESERVED),
        overlap_workers=0 if inv.training_active else len(ovl),
        training_active=inv.training_active,
        current=current,
        borrowed=len(borrowed) + inv.returned,
        batch_size=batch_size,
        remaining=remaining,
        overrides=overrides,
        future=tuple(future),
        hardware=tuple(sorted(hardware_counts(cand).items())) if typed else (),
        overlap_hardware=(ovl[0].hardware if ovl and not inv.training_active else "") if typed else "",
        worker_hardware=tuple(
            sorted((u.worker, u.hardware) for u in inv.units if u.worker is not None and u.in_service)
        )
        if typed
        else (),
    )
    # ② decide
    action = policy.on_event(ctx)
    if typed and action.target.prefill_hardware:
        return _place_typed(inv, ctx, action, current, cand, ovl, overlap, leaving)
    # ③ fit the target to what exists and choose the concrete workers
    borrow = 0 if inv.training_active else max(0, min(int(action.borrow), len(ovl)))
    want_ded = max(0, min(action.target.total - borrow, len(cand)))
    total = want_ded + borrow
    target = fit(action.target, total) if total > 0 else Configuration.colocated(0)
    chosen = cand[:want_ded] + ovl[:borrow]
    used = {u.worker for u in inv.units if u.worker is not None} | set(inv.taken_slots)
    free_units = [u for u in chosen if u.worker is None]
    new_slots = lowest_free_slots(len(free_units), used)
    new_workers = dict(zip(new_slots, free_units))
    slot_of = {u.key: u.worker for u in chosen if u.worker is not None} | {u.key: s for s, u in new_workers.items()}
    chosen_slots = {slot_of[u.key] for u in chosen}
    in_service = [u for u in inv.units if u.in_service]
    current_roles = {u.worker: u.role for u in in_service if u.worker is not None and u.role is not None}
    joining = [slot_of[u.key] for u in chosen if not u.in_service]
    going = [u.worker for u in in_service if u.worker is not None and u.worker not in chosen_slots]
    plan = plan_transition(
        current_roles,
        {r: n for r, n in target.role_counts().items() if n > 0},
        joining=joining,
        leaving=going,
        inflight={u.worker: u.inflight for u in in_service if u.worker is not None},
        overlap=[u.worker for u in overlap if u.worker is not None],
    )
    budget = {
        "dedicated_workers": len(cand),
        "overlap_workers": ctx.overlap_workers,
        "borrowed": ctx.borrowed,
        "training_active": inv.training_active,
        "leaving": sorted(u.worker for u in leaving if u.worker is not None),
    }
    return Placement(ctx, action, current, target, borrow, plan, new_workers, budget)


def _place_typed(
    inv: Inventory,
    ctx: PolicyContext,
    action: PolicyAction,
    current: Configuration | None,
    cand: list[Unit],
    ovl: list[Unit],
    overlap: list[Unit],
    leaving: list[Unit],
) -> Placement:
    """③ for a target that names chip types: each type's units take only that type's roles (a TP group never
    mixes types), dedicated units first, then borrowed overlap units of the type (at most `action.borrow`);
    one minimal-change plan per type (`plan_transition`), merged into one plan."""
    target = action.target
    borrow_cap = 0 if inv.training_active else max(0, min(int(action.borrow), len(ovl)))
    if target.mode is Mode.COLOCATED:
        wants: list[tuple[set[str], int]] = [(set(target.prefill_hardware.split("+")), target.n_colocated)]
    elif target.cross_type:
        wants = [({target.decode_hardware}, target.n_decode), ({target.prefill_hardware}, target.n_prefill)]
    else:
        wants = [({target.prefill_hardware}, target.total)]
    chosen: list[Unit] = []
    taken: set[Hashable] = set()
    borrowed_n = 0
    for types, n in wants:
        got = 0
        for u in cand + ovl:
            if got >= n:
                break
            if u.hardware not in types or u.key in taken or (u.overlap and borrowed_n >= borrow_cap):
                continue
            taken.add(u.key)
            chosen.append(u)
            got += 1
            borrowed_n += u.overlap
    # the configuration the chosen units can serve (fewer units than asked: the counts shrink, types kept)
    hw_of = {u.key: u.hardware for u in chosen}
    if target.mode is Mode.COLOCATED:
        fitted = Configuration.colocated(len(chosen), target.prefill_hardware) if chosen else Configuration.colocated(0)
        counts = {h: {Role.COLOCATED: sum(1 for k in hw_of if hw_of[k] == h)} for h in set(hw_of.values())}
    elif target.cross_type:
        n_d = sum(1 for h in hw_of.values() if h == target.decode_hardware)
        n_p = len(chosen) - n_d
        fitted = (
            Configuration.disaggregated(n_p, n_d, target.prefill_hardware, target.decode_hardware)
            if n_p and n_d
            else Configuration.colocated(len(chosen), target.decode_hardware if n_d else target.prefill_hardware)
        )
        counts = {h: {r: n for r, n in fitted.role_counts().items() if n > 0} for h in set(hw_of.values())}
        if n_p and n_d:
            counts = {target.prefill_hardware: {Role.PREFILL: n_p}, target.decode_hardware: {Role.DECODE: n_d}}
    else:
        f = fit(Configuration(target.mode, target.n_prefill, target.n_decode, target.n_colocated), len(chosen))
        h = target.prefill_hardware
        fitted = (
            Configuration.colocated(f.n_colocated, h)
            if f.mode is Mode.COLOCATED
            else Configuration.disaggregated(f.n_prefill, f.n_decode, h)
        )
        counts = {h: {r: n for r, n in f.role_counts().items() if n > 0}} if chosen else {}
    used = {u.worker for u in inv.units if u.worker is not None} | set(inv.taken_slots)
    free_units = [u for u in chosen if u.worker is None]
    new_slots = lowest_free_slots(len(free_units), used)
    new_workers = dict(zip(new_slots, free_units, strict=True))
    slot_of = {u.key: u.worker for u in chosen if u.worker is not None} | {u.key: s for s, u in new_workers.items()}
    chosen_slots = {slot_of[u.key] for u in chosen}
    in_service = [u for u in inv.units if u.in_service]
    overlap_slots = [u.worker for u in overlap if u.worker is not None]
    plans: list[TransitionPlan] = []
    for h in sorted({u.hardware for u in in_service} | set(hw_of.values())):
        mine = [u for u in in_service if u.hardware == h and u.worker is not None]
        plans.append(
            plan_transition(
                {u.worker: u.role for u in mine if u.worker is not None and u.role is not None},
                counts.get(h, {}),
                joining=[slot_of[u.key] for u in chosen if u.hardware == h and not u.in_service],
                leaving=[u.worker for u in mine if u.worker is not None and u.worker not in chosen_slots],
                inflight={u.worker: u.inflight for u in mine if u.worker is not None},
                overlap=overlap_slots,
            )
        )
    budget: dict[str, object] = {
        "dedicated_workers": len(cand),
        "overlap_workers": ctx.overlap_workers,
        "borrowed": ctx.borrowed,
        "training_active": inv.training_active,
        "leaving": sorted(u.worker for u in leaving if u.worker is not None),
        "hardware": dict(ctx.hardware),
    }
    return Placement(ctx, action, current, fitted, borrowed_n, merge_plans(plans), new_workers, budget)


_PHASE = {StepKind.START_WORKER: 1, StepKind.ACTIVATE_OVERLAP: 1, StepKind.SYNC_WEIGHTS: 1}


def merge_plans(plans: Sequence[TransitionPlan]) -> TransitionPlan:
    """One plan from per-type plans over disjoint workers, its steps in the executor's phase order
    (forced removals, additions, role changes, voluntary removals), each plan's own order kept within a phase."""
    if len(plans) == 1:
        return plans[0]
    add: dict[int, Role] = {}
    reassign: dict[int, Role] = {}
    result: dict[int, Role] = {}
    remove: list[int] = []
    keyed: list[tuple[int, int, int, Step]] = []
    for plan in plans:
        add |= plan.add
        reassign |= plan.reassign
        result |= plan.result
        remove += plan.remove
        for i, st in enumerate(plan.steps):
            if st.forced:
                phase = 0
            elif st.kind in _PHASE:
                phase = 1
            elif st.worker in plan.reassign:
                phase = 2
            else:
                phase = 3
            keyed.append((phase, len(keyed), i, st))
    keyed.sort(key=lambda k: (k[0], k[1]))
    h = hashlib.blake2b(digest_size=8)
    for plan in plans:
        h.update(plan.plan_id.encode())
    return TransitionPlan(
        add,
        tuple(remove),
        reassign,
        tuple(k[3] for k in keyed),
        sum(p.d_worker for p in plans),
        sum(p.d_role for p in plans),
        result,
        h.hexdigest(),
    )


def hardware_counts(units: Sequence[Unit]) -> dict[str, int]:
    """Dedicated rollout units per chip type, leaving ones excluded: the pool `decide_mixed` plans over."""
    out: dict[str, int] = {}
    for u in units:
        if not u.overlap and not u.leaving:
            out[u.hardware] = out.get(u.hardware, 0) + 1
    return out


def assign_typed_roles(units: Sequence[Unit], target: Configuration) -> dict[Hashable, Role]:
    """Which unit takes which role for a configuration that names chip types (minimal change).

    Prefill (or colocated) workers come only from `target.prefill_hardware` units, decode workers only from
    `target.decode_hardware` units ('A+B' for a colocated target names several types). Within a type, units
    already serving the role keep it first, then in-service units of another role (a role flip costs a
    drain, a start costs a minute), then free units, each in stable order. Raises ValueError when a type
    has too few units (the decision plans only over what `hardware_counts` reports)."""
    free = [u for u in units if not u.overlap and not u.leaving]
    taken: set[Hashable] = set()
    out: dict[Hashable, Role] = {}

    def pick(types: set[str], role: Role, n: int) -> None:
        pool = [u for u in free if u.hardware in types and u.key not in taken]
        pool.sort(key=lambda u: (0 if u.role is role else 1 if u.in_service else 2, str(u.key)))
        if len(pool) < n:
            raise ValueError(f"{n} {role} workers wanted on {'+'.join(sorted(types))}, {len(pool)} units there")
        for u in pool[:n]:
            taken.add(u.key)
            out[u.key] = role

    if target.mode is Mode.COLOCATED:
        pick(set(target.prefill_hardware.split("+")), Role.COLOCATED, target.n_colocated)
    else:
        # the decode side first when the types differ: it is the one the KV-feasibility rule sized
        pick({target.decode_hardware}, Role.DECODE, target.n_decode)
        pick({target.prefill_hardware}, Role.PREFILL, target.n_prefill)
    return out


__all__ = [
    "Inventory",
    "Placement",
    "Unit",
    "assign_typed_roles",
    "configuration_of",
    "fit",
    "hardware_counts",
    "lowest_free_slots",
    "merge_plans",
    "place",
    "typed_configuration_of",
]
