"""The timeline and the dashboard feed: `emit` appends an Event and pushes deltas after commit."""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction
from django.utils import timezone

from controlplane.models import Event, Job, Node

log = logging.getLogger(__name__)

DASHBOARD_GROUP = "dashboard"


def agent_group(node_id: int) -> str:
    return f"agent.node.{node_id}"


def driver_group(job_id: int) -> str:
    return f"driver.job.{job_id}"


def emit(
    *,
    kind: str,
    message: str,
    job: Job | None = None,
    node: Node | None = None,
    actor: str = "system",
    data: dict[str, Any] | None = None,
) -> Event:
    """Append an Event; its delta goes to the dashboard once the transaction commits."""
    event = Event.objects.create(kind=kind, message=message, job=job, node=node, actor=actor, data=data or {})
    payload = {
        "id": event.id,
        "kind": kind,
        "message": message,
        "job": job.name if job else None,
        "node": node.name if node else None,
        "actor": actor,
        "created": event.created.isoformat(),
        "data": event.data,
    }
    push_delta_on_commit(kind="event", key=str(event.id), data=payload)
    return event


def push_delta_on_commit(*, kind: str, key: str, data: dict[str, Any]) -> None:
    """Send a small delta to every dashboard socket after commit (never before: no phantom state)."""
    transaction.on_commit(lambda: send_delta_now(kind=kind, key=key, data=data))


def send_delta_now(*, kind: str, key: str, data: dict[str, Any]) -> None:
    message = {"type": "dashboard.delta", "kind": kind, "key": key, "data": data, "ts": timezone.now().timestamp()}
    _group_send(DASHBOARD_GROUP, message)


def notify_agent_on_commit(node_id: int) -> None:
    """Tell the node's agent socket to resend the full desired state (level-triggered)."""
    transaction.on_commit(lambda: _group_send(agent_group(node_id), {"type": "desired.changed"}))


def notify_drivers_on_commit(job_ids: Any) -> None:
    """Tell these jobs' rollout drivers that what they route by may have changed (they get the new view)."""
    ids = sorted({int(j) for j in job_ids})
    if ids:

        def send() -> None:
            for j in ids:
                _group_send(driver_group(j), {"type": "driver.changed"})

        transaction.on_commit(send)


def _group_send(group: str, message: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(group, message)
    except Exception as exc:  # the write already committed; a lost push is repaired by the next snapshot
        log.warning("could not push to %s: %s", group, exc)
