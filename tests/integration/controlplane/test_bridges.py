"""The Ray bridge's use cases (services.bridges) and the reach of its credential: it issues agent
tokens only for Ray-named nodes, each good for that node alone; it reports drains and deaths only of
nodes bound to a Ray id; its token opens no agent link, an agent's token is no bridge token; a
revoked bridge token stops at its next call. No Ray here: the bridge's side is plain data."""

from __future__ import annotations

import time

import pytest
from django.utils import timezone

from controlplane.core import cluster_events as ce
from controlplane.core.agent_link import Register, SlotSpec
from controlplane.core.state import Pool
from controlplane.models import AgentCredential, Event, Node
from controlplane.services import bridges
from controlplane.services.credentials import authenticate_agent, issue_agent_token
from controlplane.services.errors import NotFound, PermissionDenied
from controlplane.services.registration import register_node
from tests.support.cluster import make_node

pytestmark = pytest.mark.django_db
RAY_ID = "ab" * 28


def register(token: str, name: str, pool: str = "elastic") -> Node:
    cred = authenticate_agent(token)
    assert cred is not None
    msg = Register(
        node=name,
        pool=Pool(pool),
        hardware="H800",
        incarnation="i1",
        slots=[SlotSpec(index=i, hardware="H800", memory_mb=0) for i in range(2)],
    )
    return register_node(credential_id=cred.pk, message=msg)


@pytest.fixture
def bridge() -> bridges.BridgePrincipal:
    principal = bridges.authenticate_bridge(bridges.issue_bridge_token(name="ray", actor="test"))
    assert principal is not None
    return principal


def test_the_bridge_token_and_agent_tokens_do_not_open_each_others_doors(bridge):
    token = bridges.issue_bridge_token(name="ray2", actor="test")
    assert authenticate_agent(token) is None
    assert bridges.authenticate_bridge(issue_agent_token(node_name="ray2")) is None


def test_an_agent_token_from_the_bridge_is_good_for_its_own_node_only(bridge):
    token = bridges.agent_token(bridge=bridge, ray_node_id=RAY_ID)
    name = ce.pearl_node_name(RAY_ID)
    with pytest.raises(PermissionDenied):
        register(token, "rollout-0")
    node = register(token, name)
    assert node.name == name and node.status == "ready"
    again = bridges.agent_token(bridge=bridge, ray_node_id=RAY_ID)  # a new placement: the old token dies
    assert authenticate_agent(token) is None and authenticate_agent(again) is not None
    assert AgentCredential.objects.get(node_name=name, revoked__isnull=True).scope == "node"


def test_binding_and_events_only_for_nodes_named_after_their_ray_id(bridge):
    hand = make_node("rollout-0", pool="elastic")
    with pytest.raises(PermissionDenied):
        bridges.bind(bridge=bridge, name="rollout-0", ray_node_id=RAY_ID, address="10.77.0.11")
    for call in (
        lambda: bridges.drain(bridge=bridge, name=hand.name, why="x"),
        lambda: bridges.gone(bridge=bridge, name=hand.name, reason="UNEXPECTED_TERMINATION", message=""),
        lambda: bridges.preemption(bridge=bridge, name=hand.name, deadline=time.time() + 30),
    ):
        with pytest.raises(NotFound):
            call()
    assert Node.objects.get(pk=hand.pk).status == "ready"


def test_a_ray_drain_and_death_reach_the_node_with_rays_deadline_and_reason(bridge):
    name = ce.pearl_node_name(RAY_ID)
    register(bridges.agent_token(bridge=bridge, ray_node_id=RAY_ID), name)
    bridges.bind(bridge=bridge, name=name, ray_node_id=RAY_ID, address="10.77.0.11")
    bridges.bind(bridge=bridge, name=name, ray_node_id=RAY_ID, address="10.77.0.11")  # already right: no event
    assert Event.objects.filter(kind="node.ray_bound").count() == 1
    view = bridges.ray_nodes(bridge=bridge)[name]
    from controlplane.selectors.cluster import node_summary

    shown = node_summary(Node.objects.get(name=name).pk)  # what the dashboard and `pearl nodes` show
    assert shown and (shown["ray_node_id"], shown["ray_address"]) == (RAY_ID, "10.77.0.11")
    assert (view.ray_node_id, view.status) == (RAY_ID, "ready")
    deadline = time.time() + 10
    bridges.apply(bridge=bridge, action=ce.Notice(name, deadline))
    node = Node.objects.get(name=name)
    assert node.status == "draining" and abs(node.preemption_deadline.timestamp() - deadline) < 0.01
    assert Event.objects.get(kind="node.preemption_notice").actor == "bridge:ray"
    assert (
        ce.reconcile(
            [
                ce.NodeDraining(
                    RAY_ID,
                    "10.77.0.11",
                    deadline,
                    "preemption",
                    ce.NodeUp(RAY_ID, "10.77.0.11", "", {"GPU": 2.0}, {ce.POOL_LABEL: "elastic"}),
                )
            ],
            bridges.ray_nodes(bridge=bridge),
            {RAY_ID},
        )
        == []
    )  # PEARL shows it: nothing to do again
    bridges.apply(bridge=bridge, action=ce.Gone(name, "AUTOSCALER_DRAIN_PREEMPTED", "preempted"))
    gone = Event.objects.get(kind="node.gone")
    assert gone.data["ray_death_reason"] == "AUTOSCALER_DRAIN_PREEMPTED"
    assert Node.objects.get(name=name).status == "gone" and not Node.objects.get(name=name).gpus.filter(present=True)
    bridges.gone(bridge=bridge, name=name, reason="AUTOSCALER_DRAIN_PREEMPTED", message="")  # once only
    assert Event.objects.filter(kind="node.gone").count() == 1
    dead = ce.NodeDead(RAY_ID, "10.77.0.11", "AUTOSCALER_DRAIN_PREEMPTED", "preempted")
    assert ce.reconcile([dead], bridges.ray_nodes(bridge=bridge), set()) == []  # the reason is on record


def test_a_node_let_go_at_its_deadline_still_gets_rays_death_reason_once(bridge):
    from controlplane.services.draining import remove_preempted

    name = ce.pearl_node_name(RAY_ID)
    register(bridges.agent_token(bridge=bridge, ray_node_id=RAY_ID), name)
    bridges.bind(bridge=bridge, name=name, ray_node_id=RAY_ID, address="10.77.0.11")
    bridges.preemption(bridge=bridge, name=name, deadline=time.time() + 0.2)
    time.sleep(0.3)
    assert remove_preempted() == [name]  # PEARL's sweeper was first
    dead = ce.NodeDead(RAY_ID, "10.77.0.11", "AUTOSCALER_DRAIN_PREEMPTED", "preempted")
    actions = ce.reconcile([dead], bridges.ray_nodes(bridge=bridge), set())
    assert actions == [ce.DeathRecorded(name, "AUTOSCALER_DRAIN_PREEMPTED", "preempted")]
    bridges.apply(bridge=bridge, action=actions[0])
    assert Event.objects.get(kind="node.ray_dead").data["ray_death_reason"] == "AUTOSCALER_DRAIN_PREEMPTED"
    assert ce.reconcile([dead], bridges.ray_nodes(bridge=bridge), set()) == []


def test_a_node_pearl_drains_as_its_pool_shrinks_is_released_to_ray_once_its_workers_are_gone(bridge):
    from controlplane.core.state import Activity, Role
    from controlplane.models import Worker
    from controlplane.services.availability import set_elastic_capacity
    from controlplane.services.workers import start_worker
    from tests.support.cluster import make_job

    name = ce.pearl_node_name(RAY_ID)
    register(bridges.agent_token(bridge=bridge, ray_node_id=RAY_ID), name)
    bridges.bind(bridge=bridge, name=name, ray_node_id=RAY_ID, address="10.77.0.11")
    node = Node.objects.get(name=name)
    job = make_job()
    if not Worker.objects.filter(node=node, alive=True).exists():  # the job's first plan may have placed one
        start_worker(job_id=job.pk, node_id=node.pk, gpu_indexes=[0], role=Role.COLOCATED, activity=Activity.ACTIVE)
    up = ce.NodeUp(RAY_ID, "10.77.0.11", "", {"GPU": 2.0}, {ce.POOL_LABEL: "elastic"})
    assert set_elastic_capacity(gpus=0, notice_s=60, actor="trace").preempted == (name,)  # the pool shrinks
    view = bridges.ray_nodes(bridge=bridge)[name]
    assert view.status == "draining" and view.live_workers >= 1
    assert ce.reconcile([up], bridges.ray_nodes(bridge=bridge), {RAY_ID}, release_drained=True) == []  # drains on
    Worker.objects.filter(node=node).update(alive=False)  # the drain is over
    actions = ce.reconcile([up], bridges.ray_nodes(bridge=bridge), {RAY_ID}, release_drained=True)
    assert actions == [ce.Release(name, RAY_ID)]
    bridges.released(bridge=bridge, name=name, accepted=False, why="node is not idle")
    bridges.released(bridge=bridge, name=name, accepted=False, why="node is not idle")  # asked again: on record once
    assert Event.objects.filter(kind="node.ray_release_refused").count() == 1
    bridges.released(bridge=bridge, name=name, accepted=True, why="")
    assert Event.objects.get(kind="node.ray_released").actor == "bridge:ray"


def test_a_revoked_bridge_token_stops_at_its_next_call(bridge):
    AgentCredential.objects.filter(pk=bridge.credential_id).update(revoked=timezone.now())
    with pytest.raises(PermissionDenied):
        bridges.ray_nodes(bridge=bridge)
    with pytest.raises(PermissionDenied):
        bridges.agent_token(bridge=bridge, ray_node_id=RAY_ID)


class _Ray:
    """What the bridge command reads of Ray, as plain data: these nodes, each with an agent actor."""

    def __init__(self, events: list[ce.NodeEvent]) -> None:
        self.events = events

    def observe(self) -> list[ce.NodeEvent]:
        return self.events

    def agent_actors(self) -> set[str]:
        return {e.ray_node_id for e in self.events}


def test_a_ray_drain_of_several_nodes_is_one_notice_call_and_a_refused_node_refuses_only_itself(
    bridge, monkeypatch, capsys
):
    """The bridge command delivers the preemption notices of one look in one call (one transaction, one
    re-plan per job); when that call is refused (here Ray's drain of one node has a deadline already past),
    it delivers them one by one, so only that node's notice is refused."""
    import json

    from controlplane.management.commands.ray_bridge import Command
    from controlplane.services import draining

    ids = [f"{i:02x}" * 28 for i in (0xA1, 0xA2, 0xA3)]
    names = [ce.pearl_node_name(i) for i in ids]
    for rid, name in zip(ids, names, strict=True):
        register(bridges.agent_token(bridge=bridge, ray_node_id=rid), name)
        bridges.bind(bridge=bridge, name=name, ray_node_id=rid, address="10.77.0.11")
    up = {rid: ce.NodeUp(rid, "10.77.0.11", "", {"GPU": 2.0}, {ce.POOL_LABEL: "elastic"}) for rid in ids}
    calls: list[int] = []
    real = draining.preemption_notices

    def spy(**kw):
        calls.append(len(kw["deadlines"]))
        return real(**kw)

    monkeypatch.setattr(draining, "preemption_notices", spy)
    command = Command()
    deadline = time.time() + 60
    ray = _Ray([ce.NodeDraining(r, "10.77.0.11", deadline, "preemption", up[r]) for r in ids[:2]])
    assert command.reconcile_once(bridge, None, ray, include_head=True) == 2
    assert calls == [2]
    assert set(Node.objects.filter(name__in=names[:2]).values_list("status", flat=True)) == {"draining"}
    calls.clear()
    later = deadline + 60  # Ray moved the first two drains' deadline; the third node's drain is long past
    ray.events = [ce.NodeDraining(r, "10.77.0.11", later, "preemption", up[r]) for r in ids[:2]]
    ray.events.append(ce.NodeDraining(ids[2], "10.77.0.11", time.time() - 5, "preemption", up[ids[2]]))
    capsys.readouterr()
    assert command.reconcile_once(bridge, None, ray, include_head=True) == 3
    assert calls == [3, 1, 1, 1]  # refused together, then one by one
    shown = {n.name: n for n in Node.objects.filter(name__in=names)}
    assert [shown[n].status for n in names] == ["draining", "draining", "ready"]
    assert all(abs(shown[n].preemption_deadline.timestamp() - later) < 0.01 for n in names[:2])
    logged = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [e["bridge"] for e in logged] == ["notice", "notice", "refused"]
    assert "in the future" in logged[2]["detail"]
