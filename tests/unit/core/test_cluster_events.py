"""The Ray bridge's one rule (core.cluster_events.reconcile): level in, the missing actions out, and
nothing when PEARL already shows what Ray shows (what makes a restarted bridge change nothing)."""

from __future__ import annotations

import pytest

from controlplane.core.cluster_events import (
    Bind,
    DeathRecorded,
    Drain,
    Gone,
    NodeDead,
    NodeDraining,
    NodeEvent,
    NodeUp,
    Notice,
    PearlNodeView,
    PlaceAgent,
    Release,
    pearl_node_name,
    reconcile,
)

A, B, H = "a1" * 28, "b2" * 28, "c3" * 28


def up(rid: str, *, gpus: int = 2, pool: str = "elastic", head: bool = False) -> NodeUp:
    return NodeUp(rid, "10.77.0.2", "h", {"GPU": float(gpus), "CPU": 1.0}, {"pearl.io/pool": pool}, is_head=head)


def view(rid: str, status: str = "ready", pool: str = "elastic", deadline: float | None = None, bound: bool = True):
    return PearlNodeView(pearl_node_name(rid), rid if bound else "", status, pool, deadline)


def test_new_nodes_get_an_agent_and_the_head_and_gpu_less_nodes_do_not():
    observed: list[NodeEvent] = [up(A), up(B, gpus=0), up(H, head=True)]
    assert reconcile(observed, {}, set()) == [PlaceAgent(up(A))]
    assert reconcile(observed, {}, set(), include_head=True) == [PlaceAgent(up(A)), PlaceAgent(up(H, head=True))]


def test_a_registered_node_is_bound_once_and_then_nothing_changes():
    pearl = {pearl_node_name(A): view(A, bound=False)}
    assert reconcile([up(A)], pearl, {A}) == [Bind(pearl_node_name(A), A, "10.77.0.2")]
    assert reconcile([up(A)], {pearl_node_name(A): view(A)}, {A}) == []


def test_a_preemption_drain_is_a_notice_with_rays_deadline_once():
    ev = NodeDraining(A, "10.77.0.2", 1_000_010.0, "preemption", up(A))
    assert reconcile([ev], {pearl_node_name(A): view(A)}, {A}) == [Notice(pearl_node_name(A), 1_000_010.0)]
    already = {pearl_node_name(A): view(A, "draining", deadline=1_000_010.4)}
    assert reconcile([ev], already, {A}) == []
    moved = {pearl_node_name(A): view(A, "draining", deadline=1_000_030.0)}  # Ray moved the deadline
    assert reconcile([ev], moved, {A}) == [Notice(pearl_node_name(A), 1_000_010.0)]


@pytest.mark.parametrize(
    "reason, deadline, pool", [("idle_termination", None, "elastic"), ("preemption", 1_000_010.0, "reserved")]
)
def test_other_drains_and_preemption_of_a_non_elastic_node_are_drains(reason, deadline, pool):
    ev = NodeDraining(A, "10.77.0.2", deadline, reason, up(A, pool=pool))
    actions = reconcile([ev], {pearl_node_name(A): view(A, pool=pool)}, {A})
    assert len(actions) == 1 and isinstance(actions[0], Drain)
    assert reconcile([ev], {pearl_node_name(A): view(A, "draining", pool=pool)}, {A}) == []


def test_a_dead_node_is_gone_at_once_with_rays_reason_and_only_once():
    ev = NodeDead(A, "10.77.0.2", "UNEXPECTED_TERMINATION", "health check failed")
    assert reconcile([ev], {pearl_node_name(A): view(A)}, set()) == [
        Gone(pearl_node_name(A), "UNEXPECTED_TERMINATION", "health check failed")
    ]
    gone = view(A, "gone")  # PEARL let it go first (its preemption deadline): Ray's reason is still news, once
    assert reconcile([ev], {pearl_node_name(A): gone}, set()) == [
        DeathRecorded(pearl_node_name(A), "UNEXPECTED_TERMINATION", "health check failed")
    ]
    recorded = PearlNodeView(gone.name, A, "gone", "elastic", None, ray_death_recorded=True)
    assert reconcile([ev], {pearl_node_name(A): recorded}, set()) == []
    assert reconcile([ev], {}, set()) == []  # a node PEARL never knew: nothing to do


def test_ray_names_are_derived_from_ray_ids_only():
    assert pearl_node_name(A) == "ray-" + A[:12]
    with pytest.raises(ValueError):
        pearl_node_name("../../etc")


def _drained(rid: str, *, workers: int = 0, pool: str = "elastic", status: str = "draining") -> PearlNodeView:
    return PearlNodeView(pearl_node_name(rid), rid, status, pool, 1_000_060.0, live_workers=workers)


def test_an_elastic_node_pearl_drained_goes_back_to_ray_once_its_workers_are_gone():
    name = pearl_node_name(A)
    assert reconcile([up(A)], {name: _drained(A)}, {A}, release_drained=True) == [Release(name, A)]
    # stateless: the agent already stopped (a bridge restarted between its two calls): released, not placed again
    assert reconcile([up(A)], {name: _drained(A)}, set(), release_drained=True) == [Release(name, A)]
    assert reconcile([up(A)], {name: _drained(A)}, {A}) == []  # not asked for: the agent stays
    assert reconcile([up(A)], {name: _drained(A, workers=1)}, {A}, release_drained=True) == []  # still draining


@pytest.mark.parametrize("pool, status", [("reserved", "draining"), ("elastic", "ready"), ("elastic", "gone")])
def test_only_a_draining_elastic_node_is_released(pool, status):
    name = pearl_node_name(A)
    assert reconcile([up(A)], {name: _drained(A, pool=pool, status=status)}, {A}, release_drained=True) == []


def test_a_node_ray_drains_after_the_release_is_left_alone():
    name = pearl_node_name(A)
    ev = NodeDraining(A, "10.77.0.2", None, "idle_termination", up(A))
    assert reconcile([ev], {name: _drained(A)}, set(), release_drained=True) == []  # already draining in PEARL
