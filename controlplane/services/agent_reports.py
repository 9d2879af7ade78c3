"""What a node's agent reports besides its heartbeat: worker faults and telemetry, each fenced like a heartbeat
(the lease holder's socket, the current epoch: `leases.fence`) and checked against what the node runs."""

from __future__ import annotations

from django.db import transaction

from controlplane.core.agent_link import Fault, TelemetryBatch
from controlplane.services import credentials, leases, telemetry
from controlplane.services.events import emit
from controlplane.services.principals import node_principal


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


def record_telemetry(*, node_id: int, message: TelemetryBatch, channel: str = "") -> int:
    """Telemetry from a node's agent: fenced like a heartbeat, then checked against what the node runs."""
    with transaction.atomic():
        node = leases.fence(node_id, channel, message.epoch)
        return telemetry.ingest(principal=node_principal(node), message=message)


def record_agent_report(
    *, credential_id: int | None, node_id: int, message: TelemetryBatch | Fault, channel: str
) -> bool:
    """An agent socket's telemetry or fault: its token re-checked and the report recorded, in one call (one
    trip to the database thread); False: the token was revoked."""
    if credential_id is None or not credentials.credential_is_valid(credential_id):
        return False
    if isinstance(message, TelemetryBatch):
        record_telemetry(node_id=node_id, message=message, channel=channel)
    else:
        record_fault(node_id=node_id, message=message, channel=channel)
    return True
