"""Use cases of a cluster bridge (the Ray bridge, `manage.py ray_bridge`): it holds its own credential
(scope "bridge", prefix pbr_), which opens no agent link and no API, and lets it do exactly this:
issue the agent token of a node named after a Ray node id (`ray-<12 hex>`), bind such a node to its
Ray id and address, and report what Ray says of such a node (a preemption drain with its deadline,
another drain, a death with Ray's reason). Every write goes through the node use cases of
services.nodes, so the invariants, events and re-plans are the ones a hand-started agent gets.
An agent the bridge starts is trusted only for its own node, as every agent is (its token is bound
to the node's name)."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from controlplane.core import cluster_events as ce
from controlplane.core.state import Activity, NodeStatus
from controlplane.models import GPU, NAME_VALIDATOR, AgentCredential, Event, Node, Worker, WorkerGPU
from controlplane.services import draining, nodes
from controlplane.services.credentials import issue_agent_token
from controlplane.services.errors import Conflict, InvalidInput, NotFound, PermissionDenied
from controlplane.services.events import emit
from controlplane.services.locks import locked

BRIDGE_TOKEN_PREFIX = "pbr_"
BRIDGE_SCOPE = "bridge"


@dataclass(frozen=True, slots=True)
class BridgePrincipal:
    credential_id: int
    name: str

    @property
    def actor(self) -> str:
        return f"bridge:{self.name}"


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def issue_bridge_token(*, name: str, actor: str) -> str:
    """A new bridge credential; returns the plaintext token (the only time it exists)."""
    try:
        NAME_VALIDATOR(name)
    except Exception as exc:
        raise InvalidInput(f"bridge name {name!r}: {exc}", field="name") from exc
    token = BRIDGE_TOKEN_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        AgentCredential.objects.create(node_name=name, scope=BRIDGE_SCOPE, key_hash=_hash(token), prefix=token[4:12])
        emit(kind="bridge.token_issued", message=f"bridge token issued for {name}", actor=actor, data={"bridge": name})
    return token


def authenticate_bridge(token: str) -> BridgePrincipal | None:
    if not token or not token.startswith(BRIDGE_TOKEN_PREFIX) or len(token) > 200:
        return None
    cred = AgentCredential.objects.filter(key_hash=_hash(token), scope=BRIDGE_SCOPE, revoked__isnull=True).first()
    if cred is None:
        return None
    AgentCredential.objects.filter(pk=cred.pk).update(last_used=timezone.now())
    return BridgePrincipal(credential_id=cred.pk, name=cred.node_name)


def _check(bridge: BridgePrincipal) -> None:
    """Re-checked on every use case: a revoked bridge token stops working at its next call."""
    if not AgentCredential.objects.filter(pk=bridge.credential_id, scope=BRIDGE_SCOPE, revoked__isnull=True).exists():
        raise PermissionDenied("this bridge token is not valid")


def _ray_name(ray_node_id: str) -> str:
    try:
        return ce.pearl_node_name(ray_node_id)
    except ValueError as exc:
        raise InvalidInput(str(exc), field="ray_node_id") from None


def _unix(value: datetime | None) -> float | None:
    return value.timestamp() if value else None


def ray_nodes(*, bridge: BridgePrincipal) -> dict[str, ce.PearlNodeView]:
    """PEARL's view of the nodes a Ray bridge may speak for (named after a Ray node id)."""
    _check(bridge)
    rows = (
        Node.objects.filter(name__startswith="ray-")
        .annotate(live=Count("workers", filter=Q(workers__alive=True)))
        .values_list("name", "ray_node_id", "status", "pool", "preemption_deadline", "live")
    )
    recorded = set(
        Event.objects.filter(
            kind__in=["node.gone", "node.ray_dead"], node__name__startswith="ray-", data__has_key="ray_death_reason"
        ).values_list("node__name", flat=True)
    )
    return {
        n: ce.PearlNodeView(n, rid, st, pool, _unix(dl), n in recorded, live) for n, rid, st, pool, dl, live in rows
    }


def agent_token(*, bridge: BridgePrincipal, ray_node_id: str) -> str:
    """The token of the agent the bridge is about to start on a Ray node. Earlier tokens of that node
    are revoked first: the bridge starts an agent only where none runs, so none of them is in use."""
    _check(bridge)
    name = _ray_name(ray_node_id)
    node = Node.objects.filter(name=name).first()
    if node is not None and node.ray_node_id and node.ray_node_id != ray_node_id:
        raise Conflict(f"node {name} is bound to Ray node {node.ray_node_id}", field="ray_node_id")
    with transaction.atomic():
        earlier = AgentCredential.objects.filter(node_name=name, scope="node", revoked__isnull=True)
        earlier.update(revoked=timezone.now())
        return issue_agent_token(node_name=name, actor=bridge.actor)


def bind(*, bridge: BridgePrincipal, name: str, ray_node_id: str, address: str) -> None:
    """Record a registered node's Ray id and address (shown by `pearl nodes` and the dashboard)."""
    _check(bridge)
    if _ray_name(ray_node_id) != name:
        raise PermissionDenied(f"node {name!r} is not the node of Ray node {ray_node_id}", field="name")
    with transaction.atomic():
        node = locked(Node.objects.filter(name=name)).first()
        if node is None:
            raise NotFound(f"node {name} has not registered", field="name")
        if node.ray_node_id == ray_node_id and node.ray_address == address[:64]:
            return
        node.ray_node_id, node.ray_address = ray_node_id, address[:64]
        node.save(update_fields=["ray_node_id", "ray_address", "updated"])
        emit(
            kind="node.ray_bound",
            message=f"node {name} is Ray node {ray_node_id[:12]} at {address}",
            node=node,
            actor=bridge.actor,
            data={"ray_node_id": ray_node_id, "ray_address": address},
        )
        nodes.push_node(node.pk)


def _bound(name: str) -> Node:
    node = Node.objects.filter(name=name).exclude(ray_node_id="").first()
    if node is None:
        raise NotFound(f"no Ray-bound node {name}", field="name")
    return node


def preemption(*, bridge: BridgePrincipal, name: str, deadline: float) -> Node:
    """Ray drains the node for preemption: PEARL's preemption notice, with Ray's deadline."""
    _check(bridge)
    node = _bound(name)
    return draining.preemption_notice(
        node_id=node.pk, deadline=datetime.fromtimestamp(deadline, tz=UTC), actor=bridge.actor
    )


def preemptions(*, bridge: BridgePrincipal, notices: list[ce.Notice]) -> list[Node]:
    """Ray drains several nodes for preemption at once: PEARL's notices for all of them in one call (one
    transaction, one re-plan per job), each with Ray's deadline. All or nothing, as
    `draining.preemption_notices`: a refused one refuses them all (the caller may deliver them one by one)."""
    _check(bridge)
    names = {n.name for n in notices}
    bound = dict(Node.objects.filter(name__in=names).exclude(ray_node_id="").values_list("name", "pk"))
    missing = sorted(names - set(bound))
    if missing:
        raise NotFound(f"no Ray-bound node {missing[0]}", field="name")
    return draining.preemption_notices(
        deadlines={bound[n.name]: datetime.fromtimestamp(n.deadline, tz=UTC) for n in notices}, actor=bridge.actor
    )


def drain(*, bridge: BridgePrincipal, name: str, why: str) -> Node:
    _check(bridge)
    node = _bound(name)
    drained = draining.drain_node(node_id=node.pk, actor=bridge.actor)
    emit(kind="node.ray_drain", message=f"node {name}: {why}", node=drained, actor=bridge.actor, data={"why": why})
    return drained


def gone(*, bridge: BridgePrincipal, name: str, reason: str, message: str) -> Node | None:
    """Ray declared the node dead: it is gone now (its lease need not run out), its workers are
    removed and their GPUs leave; Ray's death reason and message are in the event."""
    _check(bridge)
    node_id = _bound(name).pk
    now = timezone.now()
    with transaction.atomic():
        node = locked(Node.objects.filter(pk=node_id)).first()
        if node is None or node.status == NodeStatus.GONE:
            return node
        ids = list(Worker.objects.filter(node=node, alive=True).values_list("id", flat=True))
        Worker.objects.filter(id__in=ids).update(alive=False, activity=Activity.INACTIVE, stopped_at=now)
        WorkerGPU.objects.filter(worker_id__in=ids).update(alive=False, active=False)
        GPU.objects.filter(node=node).update(present=False)
        nodes.node_lost(
            node,
            status=NodeStatus.GONE,
            kind="node.gone",
            message=f"node {node.name} is dead in Ray ({reason}: {message[:200]}); {len(ids)} worker(s) removed",
            data={
                "ray_death_reason": reason,
                "ray_death_message": message[:500],
                "removed_workers": len(ids),
                "actor": bridge.actor,
            },
        )
    return node


def death_recorded(*, bridge: BridgePrincipal, name: str, reason: str, message: str) -> None:
    """A node PEARL already let go (at its preemption deadline) died in Ray: record Ray's reason once
    (e.g. AUTOSCALER_DRAIN_PREEMPTED, Ray's confirmation that the drain was a preemption)."""
    _check(bridge)
    node = _bound(name)
    emit(
        kind="node.ray_dead",
        message=f"node {name} is dead in Ray ({reason}: {message[:200]})",
        node=node,
        actor=bridge.actor,
        data={"ray_death_reason": reason, "ray_death_message": message[:500]},
    )


def released(*, bridge: BridgePrincipal, name: str, accepted: bool, why: str) -> None:
    """The bridge handed a node PEARL had drained back to Ray (its agent stopped, an idle-termination drain
    asked of Ray): on record, with Ray's answer (Ray refuses while anything else holds the node's resources)."""
    _check(bridge)
    node = _bound(name)
    last = Event.objects.filter(node=node).order_by("-id").values_list("kind", flat=True).first()
    if not accepted and last == "node.ray_release_refused":
        return  # asked again each look while Ray refuses: on record once
    emit(
        kind="node.ray_released" if accepted else "node.ray_release_refused",
        message=f"node {name} handed back to Ray (idle-termination drain)"
        if accepted
        else f"node {name}: Ray refused the idle-termination drain: {why[:200]}",
        node=node,
        actor=bridge.actor,
        data={"accepted": accepted, "ray_rejection": why[:500]},
    )


def apply(*, bridge: BridgePrincipal, action: ce.Action) -> None:
    """One reconcile action (PlaceAgent is the bridge's own business: it needs `agent_token`)."""
    if isinstance(action, ce.Bind):
        bind(bridge=bridge, name=action.name, ray_node_id=action.ray_node_id, address=action.address)
    elif isinstance(action, ce.Notice):
        preemption(bridge=bridge, name=action.name, deadline=action.deadline)
    elif isinstance(action, ce.Drain):
        drain(bridge=bridge, name=action.name, why=action.why)
    elif isinstance(action, ce.Gone):
        gone(bridge=bridge, name=action.name, reason=action.reason, message=action.message)
    elif isinstance(action, ce.DeathRecorded):
        death_recorded(bridge=bridge, name=action.name, reason=action.reason, message=action.message)
    else:
        raise InvalidInput(f"not a node event: {type(action).__name__}")
