"""What every node use case shares: a new desired-state generation (its agent and its jobs' drivers hear of
it), the dashboard's node summaries, and the loss of a node (`node_lost`: a new epoch fences what it ran).

The node's life is told by idea: `registration`, `heartbeat`, `leases` (the whole lease: fencing, the Redis
fast path, renewal), `expiry` (the sweeper), `agent_reports` (faults, telemetry) and `draining` (drain,
preemption, return)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from django.db import transaction
from django.db.models import F

from controlplane.core.state import NodeStatus
from controlplane.models import Node, Worker
from controlplane.selectors.cluster import cluster_snapshot
from controlplane.services import leases
from controlplane.services.events import (
    emit,
    notify_agent_on_commit,
    notify_agents_on_commit,
    notify_drivers_on_commit,
    send_deltas_now,
)
from controlplane.services.plan_queue import replan_live_jobs


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
