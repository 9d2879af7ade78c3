"""Lease expiry: the heartbeat sweeper's work. A node whose lease ran out (in Redis, or on its row) loses it: its
workers are fenced and its epoch bumped (`nodes.node_lost`); the dashboard gets every node's last renewal."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

import redis
from django.db import transaction
from django.utils import timezone

from controlplane.core.state import Activity, NodeStatus
from controlplane.models import Node, Worker, WorkerGPU
from controlplane.services import leases
from controlplane.services.events import send_delta_now
from controlplane.services.locks import locked
from controlplane.services.nodes import node_lost

log = logging.getLogger(__name__)


def expire_leases(*, now: datetime | None = None) -> list[str]:
    """Mark nodes whose lease expired not_ready, bump their epoch and fence their workers.

    The candidates are the nodes whose Redis renewal ran out (ZRANGEBYSCORE) and those whose row lease ran
    out (while Redis renews, the row's lease is coarse and a live node's never does): the cost follows the
    nodes that expired, not the cluster. Each is decided under its row lock by `leases.effective_expiry`.

    A lease that ran out less than the agent-link servers' backlog ago (`leases.link_backlog`: how long their
    sockets' messages wait for the database) waits for the next sweep: its node's registration or heartbeat
    may be in that queue (after a restart, a thousand agents register at once), and losing it would add a
    new epoch and a full-path heartbeat to the queue that delayed it."""
    now = now or timezone.now()
    expired: list[str] = []
    try:
        leases.notice_empty()
        from_redis = set(leases.expired_ids(now.timestamp()))
        backlog = leases.link_backlog(now.timestamp())
    except redis.RedisError:
        from_redis, backlog = set(), 0.0
    deadline = now - timedelta(seconds=backlog)
    deferred = 0
    from_rows = set(
        Node.objects.filter(status__in=[NodeStatus.READY, NodeStatus.DRAINING], lease_expires__lt=now).values_list(
            "id", flat=True
        )
    )
    stale: list[int] = []  # Redis renewals that ran out but do not decide (the row was written behind them)
    for node_id in sorted(from_redis | from_rows):
        with transaction.atomic():
            node = locked(Node.objects.filter(pk=node_id)).first()
            if node is None or node.status not in (NodeStatus.READY, NodeStatus.DRAINING):
                stale.append(node_id)
                continue
            expiry, by_redis = leases.effective_expiry(node.pk, epoch=node.epoch, row_lease=node.lease_expires)
            if expiry is not None and expiry >= now:
                if not by_redis and node_id in from_redis:
                    stale.append(node_id)
                continue  # someone renewed it meanwhile, or the row's lease still holds
            if expiry is not None and expiry >= deadline:
                deferred += 1  # within the control plane's own backlog: decided again at the next sweep
                continue
            fenced = _fence_workers(node)
            seen = expiry - leases.lease_span() if by_redis and expiry else node.last_heartbeat
            age = (now - seen).total_seconds() if seen else None
            epoch = node.epoch + 1
            node_lost(
                node,
                status=NodeStatus.NOT_READY,
                kind="node.lease_expired",
                message=f"node {node.name} missed its lease; epoch -> {epoch}, {fenced} worker(s) fenced",
                data={"epoch": epoch, "fenced_workers": fenced, "heartbeat_age_s": age},
            )
            expired.append(node.name)
    leases.forget(stale)
    if deferred:
        log.warning("%s expired lease(s) deferred: the agent link is %.1f s behind", deferred, backlog)
    return expired


def push_last_seen() -> int:
    """The dashboard's heartbeat ages: every node's last renewal in one delta per sweep, not one delta per
    heartbeat (the page derives the age from it and its own clock). Returns how many nodes it carried."""
    seen = leases.all_last_seen()
    if seen:
        send_delta_now(kind="leases", key="all", data={"seen": {str(k): round(v, 2) for k, v in seen.items()}})
    return len(seen)


def _fence_workers(node: Node) -> int:
    """Stop every worker of the node from serving: the fencing step before any reassignment."""
    ids = list(Worker.objects.filter(node=node, alive=True).values_list("id", flat=True))
    Worker.objects.filter(id__in=ids).exclude(activity=Activity.INACTIVE).update(activity=Activity.INACTIVE)
    WorkerGPU.objects.filter(worker_id__in=ids).update(active=False)
    return len(ids)
