"""Minimal-change transition plans (paper §5, Eq. 5–6).

Given the current worker→role map and the target role counts, produce (W_add, W_remove, ρ) that
minimises D_worker + D_role, with stable slot ids, and the ordered, idempotent steps an executor
runs. Why minimal: communication groups, routing and weight broadcasts index workers, so renumbering
or needless re-roling turns a local change into a cluster-wide re-initialisation.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from controlplane.core.state import Role

# Fixed role order: deterministic plans (same inputs -> same steps and idempotency keys).
_ROLE_ORDER: tuple[Role, ...] = (Role.PREFILL, Role.DECODE, Role.COLOCATED, Role.TRAINING)


class StepKind(StrEnum):
    START_WORKER = "start_worker"
    DRAIN = "drain"
    SET_ROLE = "set_role"
    STOP_WORKER = "stop_worker"
    ACTIVATE_OVERLAP = "activate_overlap"
    DEACTIVATE_OVERLAP = "deactivate_overlap"
    SYNC_WEIGHTS = "sync_weights"


@dataclass(frozen=True, slots=True)
class Step:
    """One executor step. `key` is stable for the same plan inputs, so a resumed executor can skip
    steps already done (idempotency)."""

    kind: StepKind
    worker: int
    role: Role | None
    key: str
    forced: bool = False  # a forced removal (preemption / Training Begin return): no drain wait


@dataclass(frozen=True, slots=True)
class TransitionPlan:
    add: dict[int, Role]  # W_add: new slot -> role
    remove: tuple[int, ...]  # W_remove
    reassign: dict[int, Role]  # ρ: survivor -> new role (only those that change)
    steps: tuple[Step, ...]
    d_worker: int  # Eq. 5
    d_role: int  # Eq. 6
    result: dict[int, Role]  # the map after the transition
    plan_id: str

    @property
    def cost(self) -> int:
        """D_worker + D_role."""
        return self.d_worker + self.d_role

    @property
    def empty(self) -> bool:
        return not self.steps


def _least_loaded_first(slots: list[int], load: Mapping[int, int]) -> list[int]:
    """Sort by (in-flight work, slot id); numpy for large pools (a 32k-worker plan stays ~10 ms)."""
    if not load:
        return sorted(slots)
    if len(slots) < 256:
        return sorted(slots, key=lambda s: (load.get(s, 0), s))
    ids = np.asarray(slots, dtype=np.int64)
    work = np.fromiter((load.get(s, 0) for s in slots), dtype=np.int64, count=len(slots))
    order: list[int] = ids[np.lexsort((ids, work))].tolist()
    return order


def _role_key(r: Role) -> int:
    try:
        return _ROLE_ORDER.index(r)
    except ValueError:
        return len(_ROLE_ORDER)


def plan_transition(
    current: Mapping[int, Role],
    target: Mapping[Role, int],
    *,
    joining: Iterable[int] = (),
    leaving: Iterable[int] = (),
    inflight: Mapping[int, int] | None = None,
    overlap: Iterable[int] = (),
    sync_weights: bool = True,
) -> TransitionPlan:
    """Plan the minimal change from `current` (slot -> role) to `target` (role -> count).

    joining: slots that may be added, in preference order (else new workers take the lowest free slots).
    leaving: slots that must go (preempted / returned); they are removed first and never kept.
    inflight: slot -> in-flight work; survivors with the least are re-roled or removed first.
    overlap: slots that are overlap (training-GPU) workers: activated/deactivated rather than started/stopped.
    """
    roles = {k: (v if type(v) is Role else Role(v)) for k, v in current.items()}
    want = {Role(r): int(n) for r, n in target.items() if int(n) > 0}
    if any(int(n) < 0 for n in target.values()):
        raise ValueError("target counts must be >= 0")
    leaving_set = {int(s) for s in leaving}
    overlap_set = {int(s) for s in overlap}
    load = dict(inflight) if inflight else {}
    joining_list = [int(s) for s in joining]
    total = sum(want.values())

    forced_out = sorted(s for s in leaving_set if s in roles)
    cand = [s for s in roles if s not in leaving_set]

    # Which candidates survive: if there are too many, remove from roles in excess first (each such
    # removal also saves one role change), least in-flight first.
    load_get = load.get

    def order(s: int) -> tuple[int, int]:
        return (load_get(s, 0), s)

    by_role: dict[Role, list[int]] = {}
    for s in cand:
        by_role.setdefault(roles[s], []).append(s)
    for r, lst in by_role.items():
        by_role[r] = _least_loaded_first(lst, load)  # least in-flight first, then lowest slot
    voluntary_out: list[int] = []
    excess_n = len(cand) - total
    if excess_n > 0:
        # excess per role = n_src(r) − n_dst(r); take from the largest excess first, least in-flight first
        pool: list[tuple[int, int, int, int]] = []
        for r, lst in by_role.items():
            over = len(lst) - want.get(r, 0)
            for i in range(max(over, 0)):
                s = lst[i]
                pool.append((0, load.get(s, 0), s, _role_key(r)))
        pool.sort()
        chosen = [p[2] for p in pool[:excess_n]]
        if len(chosen) < excess_n:  # no excess role left (cannot happen: Σ excess ≥ excess_n), kept for safety
            rest = sorted((s for s in cand if s not in set(chosen)), key=order)
            chosen += rest[: excess_n - len(chosen)]
        voluntary_out = chosen
        out = set(chosen)
        for r in list(by_role):
            by_role[r] = [s for s in by_role[r] if s not in out]

    # Survivors keep their role up to the target; the rest (least in-flight first) are reassigned.
    result: dict[int, Role] = {}
    to_reassign: list[int] = []
    for r, lst in by_role.items():
        keep = want.get(r, 0)
        # keep the busiest; re-role the least busy (lst is least-first)
        n_move = max(len(lst) - keep, 0)
        to_reassign.extend(lst[:n_move])
        for s in lst[n_move:]:
            result[s] = r
    to_reassign = _least_loaded_first(to_reassign, load)
    kept_count = {r: len(lst) for r, lst in by_role.items()}
    deficits: list[Role] = []
    for r in sorted(want, key=_role_key):
        have = min(kept_count.get(r, 0), want[r])
        deficits.extend([r] * (want[r] - have))
    reassign: dict[int, Role] = {}
    for s, r in zip(to_reassign, deficits):
        reassign[s] = r
        result[s] = r
    deficits = deficits[len(to_reassign) :]

    # New workers fill the remaining deficits: joining ids first, else the lowest free slots.
    add: dict[int, Role] = {}
    if deficits:
        used = set(roles) | leaving_set
        if joining_list:
            free = [s for s in joining_list if s not in used]
            if len(free) < len(deficits):
                raise ValueError(
                    f"target needs {len(deficits)} new workers but only {len(free)} joining slots are free"
                )
        else:
            free = []
            s = 0
            while len(free) < len(deficits):
                if s not in used:
                    free.append(s)
                s += 1
        for s, r in zip(free, deficits):
            add[s] = r
            result[s] = r

    remove = tuple(forced_out) + tuple(sorted(voluntary_out))
    d_worker = len(add) + len(remove)
    d_role = len(reassign)
    plan_id = _plan_id(roles, want, joining_list, leaving_set, load, overlap_set)

    steps: list[Step] = []

    def step(kind: StepKind, worker: int, role: Role | None, forced: bool = False) -> None:
        steps.append(Step(kind, worker, role, f"{plan_id}:{len(steps)}:{kind}:{worker}", forced))

    # 1. Forced removals first (the GPUs are going away / must go back now).
    for s in forced_out:
        step(StepKind.DEACTIVATE_OVERLAP if s in overlap_set else StepKind.STOP_WORKER, s, roles[s], forced=True)
    # 2. Bring up before tear down.
    for s in sorted(add):
        step(StepKind.ACTIVATE_OVERLAP if s in overlap_set else StepKind.START_WORKER, s, add[s])
        if sync_weights and s not in overlap_set:
            step(StepKind.SYNC_WEIGHTS, s, add[s])
    # 3. Role changes: drain, then set role.
    for s in sorted(reassign, key=order if load else None):
        step(StepKind.DRAIN, s, roles[s])
        step(StepKind.SET_ROLE, s, reassign[s])
    # 4. Voluntary removals last: drain, then stop/deactivate.
    for s in sorted(voluntary_out):
        step(StepKind.DRAIN, s, roles[s])
        step(StepKind.DEACTIVATE_OVERLAP if s in overlap_set else StepKind.STOP_WORKER, s, roles[s])

    return TransitionPlan(add, remove, reassign, tuple(steps), d_worker, d_role, result, plan_id)


_ROLE_CODE = {r: i for i, r in enumerate(Role)}


def _plan_id(
    roles: dict[int, Role],
    want: dict[Role, int],
    joining: list[int],
    leaving: set[int],
    load: Mapping[int, int],
    overlap: set[int],
) -> str:
    """Deterministic digest of the plan inputs (order-independent), vectorised for 10^4–10^5 workers."""
    h = hashlib.blake2b(digest_size=8)
    if roles:
        keys = np.fromiter(roles.keys(), dtype=np.int64, count=len(roles))
        codes = np.fromiter((_ROLE_CODE[v] for v in roles.values()), dtype=np.int8, count=len(roles))
        order = np.argsort(keys, kind="stable")
        h.update(keys[order].tobytes())
        h.update(codes[order].tobytes())
    h.update(repr(sorted((str(k), v) for k, v in want.items())).encode())
    h.update(np.asarray(joining, dtype=np.int64).tobytes())
    h.update(b"|")
    h.update(np.asarray(sorted(leaving), dtype=np.int64).tobytes())
    h.update(b"|")
    if load:
        lk = np.fromiter(load.keys(), dtype=np.int64, count=len(load))
        lv = np.fromiter(load.values(), dtype=np.int64, count=len(load))
        o = np.argsort(lk, kind="stable")
        h.update(lk[o].tobytes())
        h.update(lv[o].tobytes())
    h.update(b"|")
    h.update(np.asarray(sorted(overlap), dtype=np.int64).tobytes())
    return h.hexdigest()


def transition_cost(current: Mapping[int, Role], result: Mapping[int, Role]) -> int:
    """D_worker + D_role between two maps (for checks and the brute-force test)."""
    cur, res = set(current), set(result)
    d_worker = len(res - cur) + len(cur - res)
    d_role = sum(1 for s in cur & res if current[s] != result[s])
    return d_worker + d_role


def target_counts(mode_counts: Mapping[Role, int]) -> dict[Role, int]:
    return {r: int(n) for r, n in mode_counts.items() if int(n) > 0}


__all__ = ["Step", "StepKind", "TransitionPlan", "plan_transition", "transition_cost"]
