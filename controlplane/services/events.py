"""The timeline and the dashboard feed: `emit` appends an Event and pushes deltas after commit."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Iterable
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.db import transaction
from django.utils import timezone

from controlplane.models import Event, Job, Node
from controlplane.selectors.jobs import event_dict

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
    return emit_many([Event(kind=kind, message=message, job=job, node=node, actor=actor, data=data or {})])[0]


def emit_many(events: list[Event]) -> list[Event]:
    """Append several (unsaved) Events at once, e.g. one per node of a batch: one INSERT, and their deltas
    go to the dashboard in one channel-layer message once the transaction commits."""
    if not events:
        return []
    created = Event.objects.bulk_create(events)
    push_deltas_on_commit([("event", str(e.id), event_dict(e)) for e in created])
    return created


def push_delta_on_commit(*, kind: str, key: str, data: dict[str, Any]) -> None:
    """Send a small delta to every dashboard socket after commit (never before: no phantom state)."""
    push_deltas_on_commit([(kind, key, data)])


Delta = tuple[str, str, dict[str, Any]]  # kind, key, data


def push_deltas_on_commit(deltas: list[Delta]) -> None:
    """`push_delta_on_commit` for several deltas of one change, in one channel-layer message."""
    if deltas:
        transaction.on_commit(lambda: send_deltas_now(deltas))


DELTAS_PER_MESSAGE = 128  # node summaries are ~2 KB: a message stays far below Redis' and the layer's limits


def send_delta_now(*, kind: str, key: str, data: dict[str, Any]) -> None:
    send_deltas_now([(kind, key, data)])


def send_deltas_now(deltas: list[Delta]) -> None:
    """Deltas to every dashboard socket: one `dashboard.deltas` message per DELTAS_PER_MESSAGE of them (the
    consumer takes each as if it came alone), not one channel-layer send per delta."""
    ts = timezone.now().timestamp()
    rows = [{"kind": kind, "key": key, "data": data, "ts": ts} for kind, key, data in deltas]
    if len(rows) == 1:
        _group_send_many([(DASHBOARD_GROUP, {"type": "dashboard.delta", **rows[0]})])
        return
    _group_send_many(
        [
            (DASHBOARD_GROUP, {"type": "dashboard.deltas", "deltas": rows[i : i + DELTAS_PER_MESSAGE]})
            for i in range(0, len(rows), DELTAS_PER_MESSAGE)
        ]
    )


def notify_agent_on_commit(node_id: int) -> None:
    """Tell the node's agent socket to resend the full desired state (level-triggered)."""
    notify_agents_on_commit([node_id])


def notify_agents_on_commit(node_ids: Iterable[int]) -> None:
    """`notify_agent_on_commit` for several nodes: one hop to the channel layer after commit for all."""
    ids = sorted({int(n) for n in node_ids})
    if ids:
        transaction.on_commit(lambda: _group_send_many([(agent_group(n), {"type": "desired.changed"}) for n in ids]))


def notify_drivers_on_commit(job_ids: Any) -> None:
    """Tell these jobs' rollout drivers that what they route by may have changed (they get the new view)."""
    ids = sorted({int(j) for j in job_ids})
    if ids:
        transaction.on_commit(lambda: _group_send_many([(driver_group(j), {"type": "driver.changed"}) for j in ids]))


SEND_CONCURRENCY = 16  # channel-layer sends in flight at once (each holds a Redis connection)
SEND_TIMEOUT_S = 10.0


class _SenderLoop:
    """One event loop thread per process for the channel-layer sends of sync code (Celery tasks, the
    executor, management commands). `async_to_sync` outside a server's loop runs each call on a new loop,
    where the Redis layer opens new connections: ~6 ms a send here, against ~0.3 ms on a loop that lives
    on. Recreated after a fork (a forked child has the loop object but not its thread)."""

    def __init__(self) -> None:
        self.pid = -1
        self.loop: asyncio.AbstractEventLoop | None = None
        self.lock = threading.Lock()

    def get(self) -> asyncio.AbstractEventLoop:
        with self.lock:
            if self.loop is None or self.pid != os.getpid():
                self.loop = asyncio.new_event_loop()
                self.pid = os.getpid()
                threading.Thread(target=self.loop.run_forever, name="pearl-channel-sends", daemon=True).start()
            return self.loop


_sender = _SenderLoop()


def _group_send_many(messages: list[tuple[str, dict[str, Any]]]) -> None:
    """Channel-layer group sends, all in one hop from this (sync) thread to an event loop, up to
    SEND_CONCURRENCY at once: a batch's hundred nodes cost one hop, not a hundred. The in-memory layer
    (tests, one process) is sent to on the caller's server loop (`async_to_sync`): its queues belong to
    that loop; the Redis layer on this process' sender loop."""
    layer = get_channel_layer()
    if layer is None or not messages:
        return

    async def send_all() -> list[BaseException | None]:
        gate = asyncio.Semaphore(SEND_CONCURRENCY)

        async def one(group: str, message: dict[str, Any]) -> None:
            async with gate:
                await layer.group_send(group, message)

        return await asyncio.gather(*(one(g, m) for g, m in messages), return_exceptions=True)

    try:
        if isinstance(layer, InMemoryChannelLayer):
            results = async_to_sync(send_all)()
        else:
            results = asyncio.run_coroutine_threadsafe(send_all(), _sender.get()).result(timeout=SEND_TIMEOUT_S)
    except Exception as exc:  # the write already committed; a lost push is repaired by the next snapshot
        log.warning("could not push %d message(s) to the channel layer: %s", len(messages), exc)
        return
    for (group, _), r in zip(messages, results, strict=True):
        if isinstance(r, BaseException):
            log.warning("could not push to %s: %s", group, r)
