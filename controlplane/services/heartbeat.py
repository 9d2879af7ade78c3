"""The heartbeat: an agent's report of its node, taken on the database thread when it differs from the last one
the database took (a repeated one renews in Redis: `leases.renew_in_redis`). It renews the node's lease, stores
the observed workers, checks what the agent may claim, and publishes a trainer's new weights."""

from __future__ import annotations

import ipaddress
from collections import defaultdict
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from django.db import connection, transaction
from django.utils import timezone

from controlplane.core.agent_link import Heartbeat
from controlplane.core.state import NodeStatus, Role
from controlplane.models import Job, Node, Worker, WorkerGPU
from controlplane.services import credentials, leases
from controlplane.services.dispatch import kick_executor_on_commit
from controlplane.services.events import emit, notify_drivers_on_commit, push_delta_on_commit
from controlplane.services.locks import lock_nodes, locked
from controlplane.services.nodes import bump_generations, push_node

MAX_VERSION_STEP = 8  # a trainer's report may move its job's weight version at most this far at once


class HeartbeatResult(NamedTuple):
    refused: list[str]  # what of the report was refused, one sentence each
    generation: int  # the node's current desired-state generation (the link resends it if the agent is behind)


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


def record_agent_heartbeat(
    *, credential_id: int | None, node_id: int, message: Heartbeat, channel: str
) -> HeartbeatResult | None:
    """An agent socket's heartbeat: its token re-checked and the heartbeat recorded, in one call (one trip to
    the database thread); None: the token was revoked."""
    if credential_id is None or not credentials.credential_is_valid(credential_id):
        return None
    return record_heartbeat(node_id=node_id, message=message, channel=channel)
