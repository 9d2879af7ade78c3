"""Taking nodes out of service and back: an operator's drain, preemption notices (an elastic node drains now and
goes at its deadline), the removal of nodes past their deadline, and the return of a drained or preempted node."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from controlplane.core.state import Activity, NodeStatus, Pool
from controlplane.models import GPU, Event, Node, Worker, WorkerGPU
from controlplane.services import leases
from controlplane.services.errors import Conflict, InvalidInput, NotFound
from controlplane.services.events import emit, emit_many
from controlplane.services.locks import lock_nodes, locked
from controlplane.services.nodes import bump_generation, bump_generations, node_lost, push_node, push_nodes
from controlplane.services.plan_queue import replan_live_jobs

MAX_PREEMPTION_NOTICE_S = 24 * 3600


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


def _start_draining_workers(node_ids: list[int]) -> None:
    """The active workers of these nodes go out of service (transitioning), their bindings inactive first:
    two statements, whatever number of nodes and workers."""
    active = Worker.objects.filter(node_id__in=node_ids, alive=True, activity=Activity.ACTIVE)
    WorkerGPU.objects.filter(worker__in=active).update(active=False)
    active.update(activity=Activity.TRANSITIONING)
