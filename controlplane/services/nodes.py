"""Node lifecycle: registration, heartbeats (the lease), lease expiry with fencing, drain, preemption."""

from __future__ import annotations

import ipaddress
import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import redis
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from controlplane.core.agent_link import Fault, Heartbeat, Telemetry
from controlplane.core.state import Activity, NodeStatus, Pool, Role
from controlplane.models import GPU, Event, Job, Node, Worker, WorkerGPU
from controlplane.selectors.cluster import cluster_snapshot
from controlplane.services import leases, telemetry
from controlplane.services.dispatch import kick_executor_on_commit
from controlplane.services.errors import Conflict, InvalidInput, NotFound
from controlplane.services.events import (
    emit,
    emit_many,
    notify_agent_on_commit,
    notify_agents_on_commit,
    notify_drivers_on_commit,
    push_delta_on_commit,
    send_delta_now,
    send_deltas_now,
)
from controlplane.services.locks import lock_nodes, locked
from controlplane.services.plan_queue import replan_live_jobs
from controlplane.services.principals import node_principal

log = logging.getLogger(__name__)

MAX_PREEMPTION_NOTICE_S = 24 * 3600
MAX_VERSION_STEP = 8  # a trainer's report may move its job's weight version at most this far at once


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


def _endpoint_on(node: Node, reported: str) -> str | None:
    """A worker endpoint as the control plane records it: the node's own address (seen at registration)
    and the port the agent reported; None if the report names any other host. An agent on the control
    plane's host (loopback address) may bind any loopback address (127.0.0.2, ...): that one is kept."""
    try:
        url = urlsplit(reported)
        port = url.port
    except ValueError:
        return None
    if (
        url.scheme != "http"
        or not url.hostname
        or port is None
        or url.path not in ("", "/")
        or url.query
        or url.username
    ):
        return None
    host = url.hostname
    if _is_loopback(node.address) and host not in (node.address, "127.0.0.1", "localhost", "::1"):
        return f"http://{_url_host(host)}:{port}" if _is_loopback(host) else None
    if host != node.address and not _is_loopback(node.address):
        return None
    return f"http://{_url_host(node.address or host)}:{port}"


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address in ("", "localhost")


def _url_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def relaxed_commit() -> None:
    """The current transaction commits without waiting for its WAL flush (PostgreSQL `synchronous_commit`
    off, for this transaction only): a heartbeat's report. A crash of the database may lose the last few
    hundred ms of such commits, never corrupt anything, and that equals heartbeats that did not arrive:
    the agent reports its whole state again in its next one (level-triggered), and its lease is renewed
    again. Whatever acted on such a report and committed normally afterwards (an executor marking a
    step done, a re-plan) flushed it with its own WAL, which comes later in the log. What fences or
    hands out work (registrations, epochs, lease expiry, the executor) keeps the synchronous commit.
    A flush here costs ~7 ms a commit, most of a changed heartbeat's time."""
    if connection.vendor == "postgresql" and connection.in_atomic_block:
        with connection.cursor() as c:
            c.execute("SET LOCAL synchronous_commit TO OFF")


class HeartbeatResult(NamedTuple):
    refused: list[str]  # what of the report was refused, one sentence each
    generation: int  # the node's current desired-state generation (the link resends it if the agent is behind)


def record_heartbeat(*, node_id: int, message: Heartbeat, channel: str = "") -> HeartbeatResult:
    """Renew the lease and store observed worker states.

    Raises StaleEpoch (the agent must resync) or Superseded (another socket holds the lease). An agent
    is trusted only for what it owns: workers bound to its node; endpoints on its own address; for a
    rollout worker, no weight version the job has not published; for the job's trainer, a new version
    at most MAX_VERSION_STEP ahead of the job's (a bigger jump is no real training progress).
    """
    renewed = leases.renew_unchanged_report(node_id=node_id, message=message, channel=channel)
    if renewed is not None:
        return HeartbeatResult([], renewed)
    refused: list[str] = []
    coarse = leases.redis_up()
    with transaction.atomic():
        relaxed_commit()
        # The lock order (job → node → worker): a trainer publishing new weights raises its job's version
        # and bumps every node of the job, so those rows are taken before this node's.
        publishing = _publishing_jobs(node_id, message)
        if publishing:
            list(locked(Job.objects.filter(pk__in=publishing)).order_by("pk"))
            lock_nodes(
                [node_id, *Worker.objects.filter(job_id__in=publishing, alive=True).values_list("node_id", flat=True)]
            )
        node = leases.fence(node_id, channel, message.epoch)
        # the lease runs from now, with the row locked: a heartbeat that waited for the lock (behind a
        # transition's executor) must not renew into a time already past, which the sweep would then fence
        now = timezone.now()
        recovered = node.status == NodeStatus.NOT_READY
        checked = {o.get("worker_id"): o.get("devices") for o in node.observed or [] if o.get("state") == "running"}
        before = {o.get("worker_id"): _routing_facts(o) for o in node.observed or []}
        node.last_heartbeat = now
        # while Redis renews, the row's lease is coarse (leases.py); without Redis it is the exact lease
        node.lease_expires = leases.coarse_row_lease(now) if coarse else now + leases.lease_span()
        node.applied_generation = min(message.generation, node.generation)
        node.observed = leases.stored_report(message)
        if recovered:
            node.status = NodeStatus.READY
        node.save(
            update_fields=["last_heartbeat", "lease_expires", "applied_generation", "observed", "status", "updated"]
        )
        mine = {
            w.id: w
            for w in Worker.objects.filter(
                node=node, alive=True, id__in=[o.worker_id for o in message.workers]
            ).select_related("job")
        }
        bindings: dict[int, list[int]] | None = None
        # trainers first: a rollout worker on the same node may already hold the version its trainer
        # publishes in this very heartbeat
        published: dict[int, int] = {}  # job id -> version a trainer published in this heartbeat
        changed: list[Worker] = []  # written in one UPDATE after the loop (one per worker cost 8 of 15 queries)
        for o in sorted(message.workers, key=lambda o: o.role != Role.TRAINING):
            w = mine.get(o.worker_id)
            if w is None:
                continue  # not (or no longer) bound to this node: nothing of it is stored
            recorded = _endpoint_on(node, o.endpoint) if o.endpoint else ""
            version = o.weight_version
            why = ""
            if recorded is None:
                why = f"endpoint {o.endpoint[:80]!r} is not on this node's address {node.address!r}"
            elif w.role == Role.TRAINING and version > w.job.weight_version + MAX_VERSION_STEP:
                why = (
                    f"weight version {version} is more than {MAX_VERSION_STEP} ahead of job {w.job.name}'s "
                    f"{w.job.weight_version}"
                )
            elif w.role != Role.TRAINING and version > max(w.job.weight_version, published.get(w.job_id, 0)):
                why = f"weight version {version} was never published for job {w.job.name}"
            if why:  # a refused report changes nothing about its worker
                refused.append(f"worker {w.pk}: {why}")
                continue
            endpoint: str = recorded or ""
            if (w.endpoint, w.weight_version, w.inflight) != (endpoint, version, o.inflight):
                publishes = _publishes(w, version, endpoint)
                w.endpoint, w.weight_version, w.inflight = endpoint, version, o.inflight
                changed.append(w)
                if publishes:
                    _publish_weights(w.job_id, version, node)
                    published[w.job_id] = max(published.get(w.job_id, 0), version)
            if (
                o.devices and o.state == "running" and checked.get(o.worker_id) != o.devices
            ):  # G_w is fixed for life: once per report change
                if bindings is None:  # one query for the whole heartbeat, only when a worker reports devices
                    bindings = defaultdict(list)
                    for wid, index in WorkerGPU.objects.filter(worker_id__in=list(mine), alive=True).values_list(
                        "worker_id", "gpu__index"
                    ):
                        bindings[wid].append(index)
                bound = sorted(bindings[w.pk])
                if sorted(o.devices) != bound:
                    refused.append(f"worker {w.pk}: runs on devices {o.devices}, bound to slots {bound}")
        if changed:
            Worker.objects.bulk_update(changed, ["endpoint", "weight_version", "inflight"])
        if before != {o["worker_id"]: _routing_facts(o) for o in node.observed}:
            notify_drivers_on_commit(w.job_id for w in mine.values())
            kick_executor_on_commit(w.job_id for w in mine.values())  # transition steps are confirmed by these facts
        if refused:
            emit(
                kind="agent.refused",
                message=f"node {node.name}: refused " + "; ".join(refused)[:1000],
                node=node,
                actor=f"agent:{node.name}",
                data={"refused": refused[:64]},
            )
        if recovered:
            emit(
                kind="node.recovered",
                message=f"node {node.name} is heartbeating again",
                node=node,
                actor=f"agent:{node.name}",
            )
        push_delta_on_commit(
            kind="heartbeat",
            key=str(node.pk),
            data={
                "id": node.pk,
                "name": node.name,
                "last_heartbeat": now.isoformat(),
                "status": node.status,
                "applied_generation": node.applied_generation,
            },
        )
        if recovered:
            push_node(node.pk)
        if coarse:  # the next identical report renews in Redis only; a refused one comes back here
            leases.renew_on_commit(node, digest="" if refused else leases.report_digest(message))
    return HeartbeatResult(refused, node.generation)


def _publishes(w: Worker, version: int, endpoint: str) -> bool:
    """A trainer's report publishes weights: a new version, or the same weights served from a new endpoint."""
    return w.role == Role.TRAINING and (version > w.weight_version or endpoint != w.endpoint)


def _publishing_jobs(node_id: int, message: Heartbeat) -> set[int]:
    """The jobs whose trainer on this node publishes in this heartbeat (`_publishes`). Read before any lock,
    which is exact in practice: only this node's agent changes these fields, and its heartbeats are taken
    one at a time. A heartbeat that reports no trainer (most of them) costs no query here."""
    trainers = {o.worker_id: o for o in message.workers if o.role == Role.TRAINING}
    node = Node.objects.filter(pk=node_id).first() if trainers else None
    if node is None:
        return set()
    jobs: set[int] = set()
    for w in Worker.objects.filter(node=node, alive=True, id__in=list(trainers)):
        o = trainers[w.pk]
        recorded = _endpoint_on(node, o.endpoint) if o.endpoint else ""
        if recorded is not None and _publishes(w, o.weight_version, recorded):
            jobs.add(w.job_id)
    return jobs


def _routing_facts(o: dict[str, Any]) -> tuple[Any, ...]:
    """What a driver routes by, of one observed worker (load changes do not count, idleness does)."""
    return (
        o.get("state"),
        o.get("role"),
        o.get("activity"),
        o.get("weight_version"),
        o.get("endpoint"),
        int(o.get("inflight", 0)) == 0,
    )


def record_fault(*, node_id: int, message: Fault, channel: str = "") -> None:
    """A worker fault (crash, restart, drained requests with their partial outputs), fenced like a heartbeat;
    `worker_id` 0 is the agent itself (e.g. a refused stale command)."""
    with transaction.atomic():
        node = leases.fence(node_id, channel, message.epoch)
        principal = node_principal(node)
        if message.worker_id:
            principal.check_worker(message.worker_id, "fault.worker_id")
        emit(
            kind="worker.fault",
            message=f"node {node.name}: worker {message.worker_id} {message.kind[:40]}"
            + (f" ({len(message.aborted)} aborted request(s) kept)" if message.aborted else ""),
            node=node,
            actor=principal.actor,
            data={
                "worker_id": message.worker_id,
                "kind": message.kind[:40],
                "detail": message.detail[:2000],
                "aborted": message.aborted,
            },
        )


def record_telemetry(*, node_id: int, message: Telemetry, channel: str = "") -> int:
    """Telemetry from a node's agent: fenced like a heartbeat, then checked against what the node runs."""
    with transaction.atomic():
        node = leases.fence(node_id, channel, message.epoch)
        return telemetry.ingest(principal=node_principal(node), message=message)


def _publish_weights(job_id: int, version: int, node: Node) -> None:
    """A trainer reported a new weight version (or a new endpoint): raise the job's version and send
    every node with a worker of the job its new desired state, so workers pull lazily."""
    job = locked(Job.objects.filter(pk=job_id)).first()
    if job is None:
        return
    if version > job.weight_version:
        job.weight_version = version
        job.save(update_fields=["weight_version", "updated"])
        emit(
            kind="weights.published",
            message=f"{job.name}: weights v{version}",
            job=job,
            node=node,
            actor=f"agent:{node.name}",
            data={"version": version},
        )
    bump_generations(Node.objects.filter(workers__job=job, workers__alive=True).distinct().order_by("pk"))


def _fence_workers(node: Node) -> int:
    """Stop every worker of the node from serving: the fencing step before any reassignment."""
    ids = list(Worker.objects.filter(node=node, alive=True).values_list("id", flat=True))
    Worker.objects.filter(id__in=ids).exclude(activity=Activity.INACTIVE).update(activity=Activity.INACTIVE)
    WorkerGPU.objects.filter(worker_id__in=ids).update(active=False)
    return len(ids)


def _node_lost(node: Node, *, status: NodeStatus, kind: str, message: str, data: dict[str, Any] | None = None) -> None:
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


def expire_leases(*, now: datetime | None = None) -> list[str]:
    """Mark nodes whose lease expired not_ready, bump their epoch and fence their workers.

    The candidates are the nodes whose Redis renewal ran out (ZRANGEBYSCORE) and those whose row lease ran
    out (while Redis renews, the row's lease is coarse and a live node's never does): the cost follows the
    nodes that expired, not the cluster. Each is decided under its row lock by `leases.effective_expiry`."""
    now = now or timezone.now()
    expired: list[str] = []
    try:
        leases.notice_empty()
        from_redis = set(leases.expired_ids(now.timestamp()))
    except redis.RedisError:
        from_redis = set()
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
            fenced = _fence_workers(node)
            seen = expiry - leases.lease_span() if by_redis and expiry else node.last_heartbeat
            age = (now - seen).total_seconds() if seen else None
            epoch = node.epoch + 1
            _node_lost(
                node,
                status=NodeStatus.NOT_READY,
                kind="node.lease_expired",
                message=f"node {node.name} missed its lease; epoch -> {epoch}, {fenced} worker(s) fenced",
                data={"epoch": epoch, "fenced_workers": fenced, "heartbeat_age_s": age},
            )
            expired.append(node.name)
    leases.forget(stale)
    return expired


def push_last_seen() -> int:
    """The dashboard's heartbeat ages: every node's last renewal in one delta per sweep, not one delta per
    heartbeat (the page derives the age from it and its own clock). Returns how many nodes it carried."""
    seen = leases.all_last_seen()
    if seen:
        send_delta_now(kind="leases", key="all", data={"seen": {str(k): round(v, 2) for k, v in seen.items()}})
    return len(seen)


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
            _node_lost(
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
