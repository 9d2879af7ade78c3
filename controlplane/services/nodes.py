"""Node lifecycle: registration, heartbeats (the lease), lease expiry with fencing, drain, preemption."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from controlplane.core.state import Activity, NodeStatus, Pool
from controlplane.models import GPU, Event, Node, Worker, WorkerGPU
from controlplane.selectors.cluster import cluster_snapshot
from controlplane.services import leases
from controlplane.services.errors import Conflict, InvalidInput, NotFound
from controlplane.services.events import (
    emit,
    emit_many,
    notify_agent_on_commit,
    notify_agents_on_commit,
    notify_drivers_on_commit,
    send_deltas_now,
)
from controlplane.services.locks import lock_nodes, locked
from controlplane.services.plan_queue import replan_live_jobs

log = logging.getLogger(__name__)

MAX_PREEMPTION_NOTICE_S = 24 * 3600


def push_node(node_id: int) -> None:
    """Dashboard delta with the node's full summary (after commit)."""
    push_nodes([node_id])


def push_nodes(node_ids: Iterable[int]) -> None:
    """Dashboard deltas with these nodes' full summaries, after commit: one snapshot (a constant number of
    queries) and one channel-layer message per DELTAS_PER_MESSAGE nodes, however many nodes a batch touched."""
    ids = sorted({int(i) for i in node_ids})
    if ids:
        transaction.on_commit(lambda: _push_nodes_now(ids))


def _push_nodes_now(node_ids: list[int]) -> None:
    send_deltas_now([("node", str(n["id"]), n) for n in cluster_snapshot(node_ids=node_ids)["nodes"]])


def bump_generation(node: Node) -> None:
    """A node's desired state changed: new generation; its agent, and the drivers of the jobs with
    workers there, hear about it after commit."""
    bump_generations([node])


def bump_generations(nodes: Iterable[Node]) -> None:
    """`bump_generation` for a batch of nodes in a constant number of queries (one UPDATE for all), and one
    hop to the channel layer after commit for their agents and their jobs' drivers."""
    held: dict[int, list[Node]] = defaultdict(list)
    for node in nodes:
        held[node.pk].append(node)
    if not held:
        return
    Node.objects.filter(pk__in=list(held)).update(generation=F("generation") + 1)
    bumped: dict[int, int] = {}
    for pk, generation in Node.objects.filter(pk__in=list(held)).values_list("pk", "generation"):
        bumped[pk] = generation
        for node in held[pk]:
            node.generation = generation
    # the generation a heartbeat renewed in Redis answers with (an agent that missed the push hears of it)
    transaction.on_commit(lambda: leases.mirror_generations(bumped))
    notify_agents_on_commit(held)
    notify_drivers_on_commit(Worker.objects.filter(node_id__in=list(held)).values_list("job_id", flat=True).distinct())


def node_lost(node: Node, *, status: NodeStatus, kind: str, message: str, data: dict[str, Any] | None = None) -> None:
    """The epilogue of losing a node (its lease expired, or it was preempted), inside the caller's
    transaction with the node locked: the new status, a new epoch (everything its agent started is fenced)
    and generation, the event; after commit its agent, the dashboard and the drivers of its jobs hear of
    it, and every live job is re-planned for the capacity it lost."""
    node.status = status
    node.epoch += 1
    node.generation += 1
    node.save(update_fields=["status", "epoch", "generation", "updated"])
    notify_agent_on_commit(node.pk)
    node_id = node.pk
    transaction.on_commit(lambda: leases.forget([node_id]))  # the new epoch starts with no Redis renewal
    emit(kind=kind, message=message, node=node, data=data)
    push_node(node.pk)
    notify_drivers_on_commit(Worker.objects.filter(node=node).values_list("job_id", flat=True).distinct())
    replan_live_jobs("capacity_change", node_id=node.pk)


def drain_node(*, node_id: int, actor: str) -> Node:
    """Stop placing work on a node and ask its workers to finish (workers -> transitioning)."""
    with transaction.atomic():
        node = locked(Node.objects.filter(pk=node_id)).first()
        if node is None:
            raise NotFound(f"node {node_id} does not exist", field="id")
        if node.status in (NodeStatus.DRAINING, NodeStatus.GONE):
            raise Conflict(f"node {node.name} is already {node.status}", field="status")
        node.status = NodeStatus.DRAINING
        node.save(update_fields=["status", "updated"])
        _start_draining_workers([node.pk])
        bump_generation(node)
        emit(kind="node.draining", message=f"node {node.name} is draining", node=node, actor=actor)
        push_node(node.pk)
        replan_live_jobs("capacity_change", node_id=node.pk)
    return node


def _start_draining_workers(node_ids: list[int]) -> None:
    """The active workers of these nodes go out of service (transitioning), their bindings inactive first:
    two statements, whatever number of nodes and workers."""
    active = Worker.objects.filter(node_id__in=node_ids, alive=True, activity=Activity.ACTIVE)
    WorkerGPU.objects.filter(worker__in=active).update(active=False)
    active.update(activity=Activity.TRANSITIONING)


def preemption_notice(*, node_id: int, deadline: datetime, actor: str) -> Node:
    """An elastic node will be taken away at `deadline`: drain it now and remove it by then."""
    return preemption_notices(deadlines={node_id: deadline}, actor=actor)[0]


def preemption_notices(*, deadlines: Mapping[int, datetime], actor: str) -> list[Node]:
    """Preemption notices for several elastic nodes at once (node id -> its deadline; a Ray drain of several
    nodes, a shrinking trace): each node drains now and goes by its deadline, as with one notice each, in
    one transaction: the nodes locked in id order, their workers out of service, one new generation each,
    one timeline entry each, one dashboard snapshot and one re-plan per job with workers there, whatever
    number of nodes. All or nothing: a node that may not get a notice (unknown, not elastic, gone) refuses
    the whole call. A node already under notice gets the new deadline. Returns the nodes in id order."""
    if not deadlines:
        raise InvalidInput("no nodes given", field="nodes")
    now = timezone.now()
    for deadline in deadlines.values():
        if deadline <= now:
            raise InvalidInput("the deadline must be in the future", field="deadline")
        if (deadline - now).total_seconds() > MAX_PREEMPTION_NOTICE_S:
            raise InvalidInput("the deadline must be within 24 hours", field="deadline")
    with transaction.atomic():
        held = lock_nodes(deadlines.keys())
        for node_id in sorted(deadlines):
            node = held.get(node_id)
            if node is None:
                raise NotFound(f"node {node_id} does not exist", field="id")
            if node.pool != Pool.ELASTIC:
                raise Conflict(f"only elastic nodes can be preempted; {node.name} is {node.pool}", field="pool")
            if node.status == NodeStatus.GONE:
                raise Conflict(f"node {node.name} is already gone", field="status")
        by_deadline: dict[datetime, list[int]] = defaultdict(list)
        for node_id, deadline in deadlines.items():
            by_deadline[deadline].append(node_id)
        for deadline, ids in by_deadline.items():  # one UPDATE per distinct deadline (one, from a Ray drain)
            Node.objects.filter(pk__in=ids).update(
                preemption_deadline=deadline, status=NodeStatus.DRAINING, updated=now
            )
        for node in held.values():
            node.preemption_deadline, node.status, node.updated = deadlines[node.pk], NodeStatus.DRAINING, now
        ids = sorted(held)
        _start_draining_workers(ids)
        bump_generations(held.values())
        emit_many(
            [
                Event(
                    kind="node.preemption_notice",
                    message=f"node {node.name} will be preempted at {deadlines[node.pk].isoformat()}",
                    node=node,
                    actor=actor,
                    data={"deadline": deadlines[node.pk].isoformat()},
                )
                for node in held.values()
            ]
        )
        push_nodes(ids)
        replan_live_jobs("capacity_change", node_ids=ids)
    return list(held.values())


def remove_preempted(*, now: datetime | None = None) -> list[str]:
    """Nodes past their preemption deadline are gone: their workers stop and their GPUs leave."""
    now = now or timezone.now()
    gone: list[str] = []
    for node_id in (
        Node.objects.filter(preemption_deadline__lt=now).exclude(status=NodeStatus.GONE).values_list("id", flat=True)
    ):
        with transaction.atomic():
            node = locked(Node.objects.filter(pk=node_id)).first()
            if node is None or node.status == NodeStatus.GONE:
                continue
            ids = list(Worker.objects.filter(node=node, alive=True).values_list("id", flat=True))
            Worker.objects.filter(id__in=ids).update(alive=False, activity=Activity.INACTIVE, stopped_at=now)
            WorkerGPU.objects.filter(worker_id__in=ids).update(alive=False, active=False)
            GPU.objects.filter(node=node).update(present=False)
            node_lost(
                node,
                status=NodeStatus.GONE,
                kind="node.gone",
                message=f"node {node.name} was preempted; {len(ids)} worker(s) removed",
            )
            gone.append(node.name)
    return gone


def undrain_node(*, node_id: int, actor: str) -> Node:
    """Return a draining or preempted (gone) node to service: cancel its preemption notice and make it
    ready again if its agent still holds a lease (else not_ready until the next heartbeat). The planner
    re-plans every live job, so the node's GPUs are used again."""
    now = timezone.now()
    with transaction.atomic():
        node = locked(Node.objects.filter(pk=node_id)).first()
        if node is None:
            raise NotFound(f"node {node_id} does not exist", field="id")
        if node.status not in (NodeStatus.DRAINING, NodeStatus.GONE):
            hint = " (it returns by itself when its agent heartbeats)" if node.status == NodeStatus.NOT_READY else ""
            raise Conflict(f"node {node.name} is {node.status}, not draining or gone{hint}", field="status")
        before = node.status
        expiry, _ = leases.effective_expiry(node.pk, epoch=node.epoch, row_lease=node.lease_expires)
        leased = expiry is not None and expiry > now
        node.status = NodeStatus.READY if leased else NodeStatus.NOT_READY
        node.preemption_deadline = None
        node.save(update_fields=["status", "preemption_deadline", "updated"])
        GPU.objects.filter(node=node).update(present=True)
        bump_generation(node)
        emit(
            kind="node.returned",
            message=f"node {node.name} returned to service ({before} → {node.status})",
            node=node,
            actor=actor,
            data={"before": before, "after": node.status},
        )
        push_node(node.pk)
        replan_live_jobs("capacity_change")
    return node
