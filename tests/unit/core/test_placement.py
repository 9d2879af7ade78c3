"""Placement (core/placement.py): inventory + policy action -> joins, borrows, returns, departures -> plan."""

from __future__ import annotations

from controlplane.core.context import Overrides, Signal
from controlplane.core.placement import Inventory, Unit, fit, lowest_free_slots, place
from controlplane.core.policies import make_policy
from controlplane.core.profiles import get_profile
from controlplane.core.state import Configuration, Pool, Role
from controlplane.core.transitions import StepKind

C, P, D = Role.COLOCATED, Role.PREFILL, Role.DECODE
PROFILE = get_profile("H800", "qwen3-8b", tp=2)


def policy(name: str = "fixed", **kw):
    return make_policy(name, profile=PROFILE, batch_size=64, **kw)


def run(inv: Inventory, pol=None, signal=Signal.CAPACITY_CHANGE, remaining=64, **kw):
    return place(inv, pol or policy(), signal=signal, now_s=0.0, batch_size=64, remaining=remaining, **kw)


def test_first_placement_starts_workers_on_the_lowest_free_slots_reserved_first() -> None:
    units = (
        Unit("e0", Pool.ELASTIC),
        Unit("r0", Pool.RESERVED),
        Unit("r1", Pool.RESERVED),
        Unit("t0", Pool.TRAINING, worker=1),
    )
    p = run(Inventory(units, taken_slots=frozenset({0})), policy("fixed", workers=2), signal=Signal.STEP_START)
    assert p.current is None and p.target == Configuration.colocated(2)
    # slot 0 is the training worker's, 1 the overlap worker's: new workers take 2 and 3, on reserved units
    assert {s: u.key for s, u in p.new_workers.items()} == {2: "r0", 3: "r1"}
    assert p.plan.add == {2: C, 3: C} and not p.plan.remove


def test_leaving_units_go_first_and_survivors_keep_their_slots() -> None:
    units = (
        Unit("r0", Pool.RESERVED, 0, C),
        Unit("e0", Pool.ELASTIC, 1, C, leaving=True),
        Unit("e1", Pool.ELASTIC, 2, C),
        Unit("e2", Pool.ELASTIC),
    )
    p = run(Inventory(units), policy("elastic"))
    assert p.plan.remove == (1,)  # the preempted one, forced
    assert p.plan.steps[0].kind is StepKind.STOP_WORKER and p.plan.steps[0].forced
    assert 0 in p.plan.result and 2 in p.plan.result  # survivors never renumbered
    assert set(p.new_workers) == {3}  # a new worker takes the lowest slot not in use (1 is still leaving)
    assert p.target.total == 3


def test_the_target_is_fitted_to_what_exists_and_the_cap_bounds_it() -> None:
    units = tuple(Unit(f"r{i}", Pool.RESERVED) for i in range(6))
    assert run(Inventory(units), policy("fixed", workers=10)).target == Configuration.colocated(6)
    assert run(Inventory(units, rollout_cap=4), policy("fixed", workers=10)).target == Configuration.colocated(4)
    assert fit(Configuration.disaggregated(2, 6), 4) == Configuration.disaggregated(1, 3)


def test_borrowing_follows_the_policy_and_training_returns_everything() -> None:
    ded = tuple(Unit(f"r{i}", Pool.RESERVED, i, C) for i in range(2))
    ovl = tuple(Unit(f"t{i}", Pool.TRAINING, 10 + i) for i in range(4))
    ungated = policy("pearl", gate=False)
    p = run(Inventory(ded + ovl), ungated, signal=Signal.TRAINING_FINISHED, overrides=Overrides(force_mode="colocated"))
    assert p.borrow == 4 and set(p.plan.add) == {10, 11, 12, 13}
    assert all(s.kind is StepKind.ACTIVATE_OVERLAP for s in p.plan.steps if s.worker >= 10)
    borrowed = ded + tuple(Unit(f"t{i}", Pool.TRAINING, 10 + i, C) for i in range(4))
    q = run(
        Inventory(borrowed, training_active=True),
        ungated,
        signal=Signal.TRAINING_BEGIN,
        overrides=Overrides(force_mode="colocated"),
    )
    assert q.borrow == 0 and set(q.plan.remove) == {10, 11, 12, 13}
    assert q.plan.steps[0].kind is StepKind.DEACTIVATE_OVERLAP
    assert q.budget["overlap_workers"] == 0 and q.context.training_active


def test_elasticity_off_sends_elastic_workers_away() -> None:
    units = (Unit("r0", Pool.RESERVED, 0, C), Unit("e0", Pool.ELASTIC, 1, C))
    p = run(Inventory(units), policy("elastic"), overrides=Overrides(elasticity=False))
    assert p.plan.remove == (1,) and p.target.total == 1


def test_a_mode_switch_re_roles_the_least_busy_survivors() -> None:
    units = tuple(Unit(f"r{i}", Pool.RESERVED, i, C, inflight=i) for i in range(4))
    p = run(Inventory(units), policy("pearl"), overrides=Overrides(force_mode="disaggregated", force_ratio=(1, 3)))
    assert p.target == Configuration.disaggregated(1, 3)
    assert p.plan.reassign == {0: P, 1: D, 2: D, 3: D}
    assert not p.plan.add and not p.plan.remove


def test_lowest_free_slots() -> None:
    assert lowest_free_slots(3, {0, 2}) == [1, 3, 4]
