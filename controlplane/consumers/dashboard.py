"""The dashboard's socket: one snapshot of what the page shows, then small deltas after each commit."""

from __future__ import annotations

import asyncio
import time
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from controlplane.consumers.common import CLOSE_PROTOCOL, CLOSE_UNAUTHENTICATED
from controlplane.selectors.cluster import cluster_snapshot
from controlplane.selectors.jobs import job_name, job_series, job_status, jobs_overview, recent_events, share_history
from controlplane.selectors.simulations import simulation_runs
from controlplane.services.events import DASHBOARD_GROUP


class DashboardConsumer(AsyncJsonWebsocketConsumer):
    """Pushes one snapshot on connect (and on `{"type": "resync"}`), then small deltas after each commit.

    `?view=cluster` (default): the cluster map, jobs and events. `?view=job&job=<id>`: that job's status
    and per-step series, and only its deltas. `?view=sim`: simulator runs. Each page gets only what it shows.
    """

    view: str = "cluster"
    job_id: int | None = None
    job_name: str = ""
    pending: dict[tuple[str, str], dict[str, Any]]  # coalesced node-state deltas not sent yet, by (kind, key)
    flush_at: float = 0.0  # monotonic time of the last flush of coalesced deltas
    flusher: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        self.pending = {}
        user = self.scope.get("user")
        if not (user and user.is_authenticated):
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        params = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        self.view = (params.get("view") or ["cluster"])[0]
        if self.view == "job":
            raw = (params.get("job") or [""])[0]
            if raw.isascii() and raw.isdigit() and len(raw) <= 18:
                self.job_name = await database_sync_to_async(job_name)(int(raw))
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
        for i, chunk in enumerate(chunks[1:], start=1):
            await self.send_json({"type": "snapshot_more", "nodes": chunk, "last": i == len(chunks) - 1})

    async def disconnect(self, code: int) -> None:
        if self.flusher is not None:
            self.flusher.cancel()
        await self.channel_layer.group_discard(DASHBOARD_GROUP, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if isinstance(content, dict) and content.get("type") == "resync":
            await self._send_snapshot()

    async def dashboard_delta(self, event: dict[str, Any]) -> None:
        await self._deliver([event])

    async def dashboard_deltas(self, event: dict[str, Any]) -> None:
        """Several deltas of one commit (a batch's nodes and events) in one channel-layer message."""
        await self._deliver(event["deltas"])

    async def _deliver(self, events: list[dict[str, Any]]) -> None:
        coalesced = False
        for event in events:
            if not self._wants(event["kind"], event["key"], event["data"]):
                continue
            delta = {"type": "delta", **{k: event[k] for k in ("kind", "key", "data", "ts")}}
            if event["kind"] not in COALESCED:
                await self.send_json(delta)
                continue
            # node state: the latest delta per node wins, and this client gets them at most once per COALESCE_S
            # (leading edge: a quiet page hears of a change at once; a busy one in batches)
            self.pending[(event["kind"], event["key"])] = delta
            coalesced = True
        if coalesced and (self.flusher is None or self.flusher.done()):
            wait = self.flush_at + COALESCE_S - time.monotonic()
            if wait <= 0:
                await self._flush()
            else:
                self.flusher = asyncio.ensure_future(self._flush_after(wait))

    async def _flush_after(self, wait: float) -> None:
        await asyncio.sleep(wait)
        await self._flush()

    async def _flush(self) -> None:
        self.flush_at = time.monotonic()
        batch, self.pending = list(self.pending.values()), {}
        for delta in batch:
            await self.send_json(delta)

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


COALESCED = frozenset({"node", "heartbeat", "leases"})  # node state: only the latest counts


COALESCE_S = 0.5


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


def _snapshot(view: str, job_id: int | None) -> dict[str, Any]:
    if view == "job" and job_id is not None:
        return {"type": "snapshot", "view": "job", "status": job_status(job_id), "series": job_series(job_id)}
    if view == "sim":
        return {"type": "snapshot", "view": "sim", "runs": simulation_runs()}
    return {
        "type": "snapshot",
        "view": "cluster",
        "cluster": cluster_snapshot(),
        "jobs": jobs_overview(),
        "events": recent_events(),
        "shares": share_history(),
    }
