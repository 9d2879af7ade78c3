"""WebSocket adapters: the dashboard feed and the agent link. Thin: authenticate, parse, call a
service, answer. All state lives in the database; a socket only ever mirrors it."""
from __future__ import annotations

import json
import logging
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from controlplane.core import agent_link as link
from controlplane.models import Node
from controlplane.selectors.cluster import cluster_snapshot, desired_state
from controlplane.selectors.jobs import job_series, job_status, jobs_overview, recent_events
from controlplane.services import credentials, nodes, telemetry
from controlplane.services.errors import ServiceError
from controlplane.services.events import DASHBOARD_GROUP, agent_group, emit

log = logging.getLogger(__name__)

CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_PROTOCOL = 4400


class DashboardConsumer(AsyncJsonWebsocketConsumer):
    """Pushes one snapshot on connect (and on `{"type": "resync"}`), then small deltas after each commit.

    `?view=cluster` (default): the cluster map, jobs and events. `?view=job&job=<id>`: that job's status
    and per-step series, and only its deltas. `?view=sim`: simulator runs. Each page gets only what it shows.
    """

    view: str = "cluster"
    job_id: int | None = None
    job_name: str = ""

    async def connect(self) -> None:
        user = self.scope.get("user")
        if not (user and user.is_authenticated):
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        params = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        self.view = (params.get("view") or ["cluster"])[0]
        if self.view == "job":
            raw = (params.get("job") or [""])[0]
            self.job_name = await database_sync_to_async(_job_name)(raw)
            if not self.job_name:
                await self.close(code=CLOSE_PROTOCOL)
                return
            self.job_id = int(raw)
        elif self.view not in ("cluster", "sim"):
            await self.close(code=CLOSE_PROTOCOL)
            return
        await self.channel_layer.group_add(DASHBOARD_GROUP, self.channel_name)
        await self.accept()
        await self._send_snapshot()

    async def _send_snapshot(self) -> None:
        """One message, or for a large cluster the first of several: Daphne refuses frames over 1 MiB, so
        the nodes follow in `snapshot_more` messages of at most SNAPSHOT_CHUNK_GPUS GPUs each."""
        snapshot = await database_sync_to_async(_snapshot)(self.view, self.job_id)
        if self.view != "cluster":
            await self.send_json(snapshot)
            return
        chunks = _chunks(snapshot["cluster"]["nodes"])
        snapshot["cluster"]["nodes"] = chunks[0]
        snapshot["more"] = len(chunks) - 1
        await self.send_json(snapshot)
        for i, nodes in enumerate(chunks[1:], start=1):
            await self.send_json({"type": "snapshot_more", "nodes": nodes, "last": i == len(chunks) - 1})

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(DASHBOARD_GROUP, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if isinstance(content, dict) and content.get("type") == "resync":
            await self._send_snapshot()

    async def dashboard_delta(self, event: dict[str, Any]) -> None:
        if not self._wants(event["kind"], event["key"], event["data"]):
            return
        await self.send_json({"type": "delta", "kind": event["kind"], "key": event["key"], "data": event["data"], "ts": event["ts"]})

    def _wants(self, kind: str, key: str, data: dict[str, Any]) -> bool:
        if self.view == "sim":
            return kind == "simulation"
        if self.view == "cluster":
            return kind not in ("series", "simulation")
        if kind in ("job", "override", "series"):
            return key == str(self.job_id)
        if kind in ("event", "decision", "transition"):
            return data.get("job") == self.job_name
        return False


SNAPSHOT_CHUNK_GPUS = 2000  # about 700 KB of JSON per message


def _chunks(nodes: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    out: list[list[dict[str, Any]]] = [[]]
    gpus = 0
    for n in nodes:
        if out[-1] and gpus + len(n["gpus"]) > SNAPSHOT_CHUNK_GPUS:
            out.append([])
            gpus = 0
        out[-1].append(n)
        gpus += len(n["gpus"])
    return out


def _job_name(raw: str) -> str:
    from controlplane.models import Job

    if not raw.isdigit() or len(raw) > 18:
        return ""
    return Job.objects.filter(pk=int(raw)).values_list("name", flat=True).first() or ""


def _snapshot(view: str, job_id: int | None) -> dict[str, Any]:
    if view == "job" and job_id is not None:
        return {"type": "snapshot", "view": "job", "status": job_status(job_id), "series": job_series(job_id)}
    if view == "sim":
        from controlplane.models import SimulationRun
        from controlplane.services.simulations import run_dict

        return {"type": "snapshot", "view": "sim",
                "runs": [run_dict(r, full=False) for r in SimulationRun.objects.select_related("created_by")[:50]]}
    return {"type": "snapshot", "view": "cluster", "cluster": cluster_snapshot(), "jobs": jobs_overview(),
            "events": recent_events()}


def _bearer(scope: dict[str, Any]) -> str:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            text = value.decode("latin-1")
            if text.lower().startswith("bearer "):
                return text[7:].strip()
    return ""


class AgentConsumer(AsyncJsonWebsocketConsumer):
    """The agent link: register -> registered + desired_state; heartbeats renew the lease; every change
    of the node's desired state is pushed in full (level-triggered)."""

    credential_id: int | None = None
    node_name: str = ""
    node_id: int | None = None

    async def connect(self) -> None:
        cred = await database_sync_to_async(credentials.authenticate_agent)(_bearer(self.scope))
        if cred is None:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.credential_id, self.node_name = cred.pk, cred.node_name
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.node_id is not None:
            await self.channel_layer.group_discard(agent_group(self.node_id), self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        if text_data is None or len(text_data) > link.MAX_MESSAGE_BYTES:
            await self._error("bad_message", f"messages are JSON text of at most {link.MAX_MESSAGE_BYTES} bytes")
            return
        try:
            content = json.loads(text_data)
        except json.JSONDecodeError as exc:
            await self._error("bad_json", f"malformed JSON: {exc}")
            return
        await self.receive_json(content)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if not await database_sync_to_async(credentials.credential_is_valid)(self.credential_id):
            await self._error("revoked", "this agent token was revoked")
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        try:
            message = link.parse_agent_message(content)
        except link.LinkError as exc:
            await self._error("bad_message", str(exc))
            return
        try:
            if isinstance(message, link.Register):
                await self._register(message)
            elif self.node_id is None:
                await self._error("not_registered", "send a register message first")
            elif isinstance(message, link.Heartbeat):
                fresh = await database_sync_to_async(nodes.record_heartbeat)(node_id=self.node_id, message=message)
                if not fresh:
                    await self._error("stale_epoch", "heartbeat carries an old epoch; apply the desired state below")
                    await self._send_desired()
            elif isinstance(message, link.Telemetry):
                await database_sync_to_async(telemetry.ingest)(node_id=self.node_id, message=message)
            elif isinstance(message, link.Fault):
                await database_sync_to_async(_record_fault)(self.node_id, message)
        except ServiceError as exc:
            await self._error(exc.code, exc.message)
            if exc.status == 403:
                await self.close(code=CLOSE_FORBIDDEN)

    async def _register(self, message: link.Register) -> None:
        node = await database_sync_to_async(nodes.register_node)(credential_id=self.credential_id, message=message)
        if self.node_id is not None and self.node_id != node.pk:
            await self.channel_layer.group_discard(agent_group(self.node_id), self.channel_name)
        self.node_id = node.pk
        await self.channel_layer.group_add(agent_group(node.pk), self.channel_name)
        await self.send_json(link.dump(link.Registered(
            node_id=node.pk, epoch=node.epoch, lease_s=settings.PEARL["LEASE_S"], heartbeat_s=settings.PEARL["HEARTBEAT_S"],
        )))
        await self._send_desired()

    async def _send_desired(self) -> None:
        state = await database_sync_to_async(_desired)(self.node_id)
        if state is not None:
            await self.send_json(link.dump(state))

    async def desired_changed(self, event: dict[str, Any]) -> None:
        await self._send_desired()

    async def _error(self, code: str, message: str) -> None:
        await self.send_json(link.dump(link.ErrorMessage(code=code, message=message)))


def _desired(node_id: int | None) -> link.DesiredState | None:
    node = Node.objects.filter(pk=node_id).first()
    return desired_state(node) if node else None


def _record_fault(node_id: int, message: link.Fault) -> None:
    node = Node.objects.get(pk=node_id)
    emit(
        kind="worker.fault",
        message=f"node {node.name}: worker {message.worker_id} {message.kind}"
        + (f" ({len(message.aborted)} aborted request(s) kept)" if message.aborted else ""),
        node=node,
        actor=f"agent:{node.name}",
        data={"worker_id": message.worker_id, "kind": message.kind, "detail": message.detail[:2000], "aborted": message.aborted},
    )

