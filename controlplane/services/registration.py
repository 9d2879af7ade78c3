"""Registration: an agent socket (or a test, a seed, a benchmark) claims its node with the node's agent token
and becomes the only holder of its lease (a new epoch), and the node's GPU slots are synced to the report."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from controlplane.core.agent_link import DesiredState, Register
from controlplane.core.state import NodeStatus, Pool, Zone
from controlplane.models import GPU, AgentCredential, Node, Worker
from controlplane.selectors.cluster import agent_desired_state
from controlplane.services import leases
from controlplane.services.credentials import credential_is_valid
from controlplane.services.errors import Conflict, InvalidInput, PermissionDenied
from controlplane.services.events import emit
from controlplane.services.locks import locked
from controlplane.services.nodes import push_node
from controlplane.services.plan_queue import replan_live_jobs


def register_node(*, credential_id: int, message: Register, address: str = "127.0.0.1") -> Node:
    """Register the node the credential belongs to, outside any socket (tests, seeding, benchmarks)."""
    return register_agent(credential_id=credential_id, message=message, address=address)[0]


def register_agent_socket(
    *, credential_id: int, message: Register, channel: str, address: str
) -> tuple[Node, str, DesiredState | None] | None:
    """An agent socket's registration (`register_agent`) and the desired state it is answered with, read after
    the commit, in one trip to the database thread with the token's re-check: after a restart a thousand
    agents register at once, and each trip queues behind all the others. None: the token was revoked (the
    socket closes as for any revoked message). A change committed between the desired state's read and the
    socket joining its node's group reaches the agent at its next heartbeat (it reports a generation behind
    the node's)."""
    try:
        node, superseded = register_agent(
            credential_id=credential_id, message=message, channel=channel, address=address
        )
    except PermissionDenied:
        if not credential_is_valid(credential_id):  # checked only here: a registration reads the token anyway
            return None
        raise
    return node, superseded, agent_desired_state(node.pk, channel)


def register_agent(*, credential_id: int, message: Register, channel: str = "", address: str = "") -> tuple[Node, str]:
    """Register (or re-register) the node the credential belongs to and sync its GPU slots; returns the
    node and the channel of the socket it supersedes ("" if none).

    Every registration is a new lease holder: the epoch is bumped (whatever incarnation the message
    claims), so anything the previous socket or incarnation started is fenced, and `channel` becomes
    the only socket whose messages count. `address` is the agent's peer address as the server saw it:
    the control plane's own record of where the node's data plane lives.
    """
    credential = AgentCredential.objects.filter(pk=credential_id, revoked__isnull=True).first()
    if credential is None:
        raise PermissionDenied("this agent token is not valid")
    if credential.node_name != message.node:
        raise PermissionDenied(
            f"this token belongs to node {credential.node_name!r}, not {message.node!r}", field="node"
        )
    if not message.slots:
        raise InvalidInput("a node needs at least one GPU slot", field="slots")
    indexes = [s.index for s in message.slots]
    if len(set(indexes)) != len(indexes):
        raise InvalidInput("slot indexes must be unique", field="slots")
    now = timezone.now()
    with transaction.atomic():
        # the token's last use, in this transaction (the handshake writes nothing); a revocation committed since
        # the check above is seen here (the UPDATE waits for its row lock)
        if not AgentCredential.objects.filter(pk=credential.pk, revoked__isnull=True).update(last_used=now):
            raise PermissionDenied("this agent token is not valid")
        node = locked(Node.objects.filter(name=message.node)).first()
        created = node is None
        if node is None:
            node = Node.objects.create(name=message.node, pool=message.pool, hardware=message.hardware, epoch=0)
        elif node.pool != message.pool and Worker.objects.filter(node=node, alive=True).exists():
            raise Conflict(
                f"node {node.name} has live workers; it cannot move from pool {node.pool} to {message.pool}",
                field="pool",
            )
        new_incarnation = not created and node.incarnation != message.incarnation
        superseded = node.agent_channel if node.agent_channel != channel else ""
        node.pool = message.pool
        node.hardware = message.hardware
        node.engine = message.engine
        node.data_plane = message.data_plane
        node.incarnation = message.incarnation
        node.address = address[:64]
        node.agent_channel = channel
        node.last_heartbeat = now
        node.lease_expires = now + leases.lease_span()
        if node.status in (NodeStatus.NOT_READY, NodeStatus.GONE):
            node.status = NodeStatus.READY
            node.preemption_deadline = None
        node.epoch += 1
        node.generation += 1
        node.save()
        leases.renew_on_commit(node, digest="")  # a new epoch: no report of it is known yet
        zone = Zone.OVERLAP if message.pool == Pool.TRAINING else Zone.ROLLOUT
        existing = {g.index: g for g in GPU.objects.filter(node=node)}
        for slot in message.slots:
            g = existing.pop(slot.index, None)
            if g is None:
                GPU.objects.create(
                    node=node, index=slot.index, hardware=slot.hardware, memory_mb=slot.memory_mb, zone=zone
                )
            else:
                GPU.objects.filter(pk=g.pk).update(
                    hardware=slot.hardware, memory_mb=slot.memory_mb, zone=zone, present=True
                )
        for g in existing.values():  # slots the agent no longer reports
            GPU.objects.filter(pk=g.pk).update(present=False)
        emit(
            kind="node.registered",
            message=f"node {node.name} registered ({node.pool}, {len(message.slots)}× {message.hardware}, "
            f"epoch {node.epoch})" + (" superseding another socket" if superseded else ""),
            node=node,
            actor=f"agent:{node.name}",
            data={
                "incarnation": message.incarnation,
                "new_incarnation": new_incarnation,
                "created": created,
                "superseded": bool(superseded),
                "address": node.address,
            },
        )
        push_node(node.pk)
        replan_live_jobs("capacity_change")  # new (or returning) GPUs: every job may grow, pending ones start
    return node, superseded
