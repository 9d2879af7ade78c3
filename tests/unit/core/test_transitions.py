"""Transition plans: minimal D_worker + D_role (brute force), stable slots, step order, idempotency."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.core.state import Role
from controlplane.core.transitions import StepKind, plan_transition, transition_cost

P, D, C = Role.PREFILL, Role.DECODE, Role.COLOCATED


def brute_force_cost(current: dict[int, Role], target: dict[Role, int], leaving: set[int], joining: list[int]) -> int:
    """Minimum D_worker + D_role over every reachable map: any kept subset of non-leaving workers,
    any role assignment, new workers from joining slots (or fresh ids)."""
    cand = [s for s in current if s not in leaving]
    total = sum(target.values())
    roles = [r for r, n in target.items() for _ in range(n)]
    fresh = joining or [1000 + i for i in range(total)]
    best = None
    for k in range(0, min(len(cand), total) + 1):
        for kept in itertools.combinations(cand, k):
            new = fresh[: total - k]
            if len(new) < total - k:
                continue
            slots = list(kept) + list(new)
            for perm in set(itertools.permutations(roles)):
                result = dict(zip(slots, perm))
                cost = transition_cost(current, result)
                best = cost if best is None else min(best, cost)
    assert best is not None
    return best


roles_st = st.sampled_from([P, D, C])


@st.composite
def cases(draw):
    n = draw(st.integers(0, 5))
    slots = draw(st.lists(st.integers(0, 8), min_size=n, max_size=n, unique=True))
    current = {s: draw(roles_st) for s in slots}
    leaving = set(draw(st.lists(st.sampled_from(slots), unique=True))) if slots else set()
    disagg = draw(st.booleans())
    if disagg:
        target = {P: draw(st.integers(1, 3)), D: draw(st.integers(1, 3))}
    else:
        target = {C: draw(st.integers(0, 5))}
    inflight = {s: draw(st.integers(0, 9)) for s in slots}
    return current, target, leaving, inflight


@settings(max_examples=200, deadline=None)
@given(case=cases())
def test_cost_equals_brute_force_optimum_and_invariants_hold(case) -> None:
    current, target, leaving, inflight = case
    plan = plan_transition(current, target, leaving=leaving, inflight=inflight)
    assert plan.cost == brute_force_cost(current, target, leaving, [])
    assert plan.cost == transition_cost(current, plan.result)
    res = plan.result
    # the resulting map has exactly the target counts, and is all-colocated or all-disaggregated
    for r in (P, D, C):
        assert sum(1 for v in res.values() if v is r) == target.get(r, 0)
    has_c = any(v is C for v in res.values())
    has_pd = any(v in (P, D) for v in res.values())
    assert not (has_c and has_pd)
    if has_pd:
        assert any(v is P for v in res.values()) and any(v is D for v in res.values())
    # survivors keep their slot ids; leaving workers are gone; new ids never collide
    assert not (set(res) & leaving)
    assert set(plan.add).isdisjoint(current)
    for s in res:
        if s in current:
            assert s not in plan.add
    assert set(plan.remove) == (set(current) - set(res))
    assert set(plan.reassign) == {s for s in res if s in current and current[s] != res[s]}


def test_new_workers_take_the_lowest_free_slots_and_joining_ids_when_given() -> None:
    cur = {0: P, 2: D, 5: D}
    plan = plan_transition(cur, {P: 2, D: 3})
    assert set(plan.add) == {1, 3}
    joined = plan_transition(cur, {P: 2, D: 3}, joining=[17, 9])
    assert set(joined.add) == {17, 9}
    with pytest.raises(ValueError, match="joining"):
        plan_transition(cur, {P: 3, D: 3}, joining=[17])


def test_forced_removal_does_not_renumber_survivors() -> None:
    cur = {0: P, 1: P, 2: D, 3: D, 4: D}
    plan = plan_transition(cur, {P: 1, D: 3}, leaving=[1])
    assert plan.remove == (1,) and plan.add == {} and plan.reassign == {}
    assert plan.result == {0: P, 2: D, 3: D, 4: D}
    assert plan.cost == 1


def test_survivor_with_least_inflight_work_is_reassigned() -> None:
    cur = {0: P, 1: D, 2: D, 3: D}
    plan = plan_transition(cur, {P: 2, D: 2}, inflight={1: 7, 2: 1, 3: 4})
    assert plan.reassign == {2: P}
    assert plan.cost == 1
    shrink = plan_transition(cur, {P: 1, D: 2}, inflight={1: 7, 2: 5, 3: 0})
    assert shrink.remove == (3,)  # the idlest excess decode worker goes


def test_step_order_keeps_serving_capacity() -> None:
    cur = {0: P, 1: D, 2: D, 3: D, 4: D}
    plan = plan_transition(cur, {P: 3, D: 2}, leaving=[4], joining=[9], inflight={1: 3, 2: 1, 3: 2})
    kinds = [(s.kind, s.worker) for s in plan.steps]
    assert kinds[0] == (StepKind.STOP_WORKER, 4) and plan.steps[0].forced  # forced removal first
    start = kinds.index((StepKind.START_WORKER, 9))
    sync = kinds.index((StepKind.SYNC_WEIGHTS, 9))
    assert start < sync
    for s in plan.reassign:
        drain = kinds.index((StepKind.DRAIN, s))
        set_role = kinds.index((StepKind.SET_ROLE, s))
        assert start < drain < set_role  # bring up before tear down; drain before role change


def test_voluntary_removal_is_drained_last_and_overlap_workers_toggle() -> None:
    cur = {0: C, 1: C, 2: C, 10: C, 11: C}
    plan = plan_transition(cur, {C: 3}, leaving=[10, 11], overlap=[10, 11])
    assert [s.kind for s in plan.steps] == [StepKind.DEACTIVATE_OVERLAP, StepKind.DEACTIVATE_OVERLAP]
    grow = plan_transition({0: C, 1: C, 2: C}, {C: 5}, joining=[10, 11], overlap=[10, 11])
    assert [s.kind for s in grow.steps] == [StepKind.ACTIVATE_OVERLAP] * 2
    shrink = plan_transition({0: C, 1: C, 2: C}, {C: 2}, inflight={0: 5, 1: 0, 2: 3})
    assert [(s.kind, s.worker) for s in shrink.steps] == [(StepKind.DRAIN, 1), (StepKind.STOP_WORKER, 1)]


def test_mode_switch_reassigns_every_survivor() -> None:
    cur = {i: C for i in range(8)}
    plan = plan_transition(cur, {P: 3, D: 5})
    assert plan.d_worker == 0 and plan.d_role == 8 and plan.cost == 8


def test_idempotency_keys_are_stable_and_unique() -> None:
    cur = {0: P, 1: D, 2: D}
    a = plan_transition(cur, {P: 2, D: 2}, inflight={1: 1, 2: 3})
    b = plan_transition(dict(reversed(list(cur.items()))), {D: 2, P: 2}, inflight={2: 3, 1: 1})
    assert [s.key for s in a.steps] == [s.key for s in b.steps]
    assert len({s.key for s in a.steps}) == len(a.steps)
    c = plan_transition(cur, {P: 1, D: 3})
    assert a.plan_id != c.plan_id


def test_no_change_is_an_empty_plan() -> None:
    plan = plan_transition({0: P, 1: D}, {P: 1, D: 1})
    assert plan.empty and plan.cost == 0


def test_large_plan_has_expected_size() -> None:
    cur = {i: (P if i < 4000 else D) for i in range(16_384)}
    plan = plan_transition(cur, {P: 5000, D: 12_000})
    # 384 excess decode workers become prefill; the other 616 prefill workers are new
    assert len(plan.add) == 616 and plan.d_role == 384 and plan.cost == 1000
    assert min(plan.add) == 16_384


def test_large_pool_tie_break_matches_the_small_pool_rule() -> None:
    """The numpy path (>= 256 slots) orders survivors exactly like the plain (in-flight, slot) sort."""
    from controlplane.core.transitions import _least_loaded_first

    slots = list(range(3000, 0, -3))
    load = {s: (s * 7919) % 11 for s in slots}
    assert _least_loaded_first(slots, load) == sorted(slots, key=lambda s: (load[s], s))
    cur = {s: D for s in slots}
    plan = plan_transition(cur, {P: 10, D: len(slots) - 10}, inflight=load)
    expected = sorted(slots, key=lambda s: (load[s], s))[:10]
    assert sorted(plan.reassign) == sorted(expected)
