"""WebSocket adapters: the dashboard feed and the agent link. Thin: authenticate, parse, call a
service, answer. All state lives in the database; a socket only ever mirrors it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from controlplane.core import agent_link as link
from controlplane.core import driver_link as dl
from controlplane.core.wire import ErrorReply, WireError
from controlplane.models import Node
from controlplane.selectors.cluster import cluster_snapshot, desired_state
from controlplane.selectors.jobs import job_series, job_status, jobs_overview, recent_events
from controlplane.services import (
    agent_reports,
    credentials,
    heartbeat,
    jobs,
    latency,
    leases,
    progress,
    registration,
    telemetry,
)
from controlplane.services.errors import Conflict, PermissionDenied, ServiceError, StaleEpoch, Superseded
from controlplane.services.events import DASHBOARD_GROUP, agent_group, driver_group
from controlplane.services.retry import retry_transient
from controlplane.services.trajectories import mark_trained, record_trajectories

log = logging.getLogger(__name__)
R = TypeVar("R")

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


def _service(fn: Callable[..., R]) -> Callable[..., Awaitable[R]]:
    """A write use case called from a socket, in a worker thread; a deadlock victim runs again."""
    return database_sync_to_async(partial(retry_transient, fn))


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

        return {
            "type": "snapshot",
            "view": "sim",
            "runs": [run_dict(r, full=False) for r in SimulationRun.objects.select_related("created_by")[:50]],
        }
    return {
        "type": "snapshot",
        "view": "cluster",
        "cluster": cluster_snapshot(),
        "jobs": jobs_overview(),
        "events": recent_events(),
    }


def _bearer(scope: dict[str, Any]) -> str:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            text = value.decode("latin-1")
            if text.lower().startswith("bearer "):
                return text[7:].strip()
    return ""


class AgentConsumer(AsyncJsonWebsocketConsumer):
    """The agent link: register -> registered + desired_state; heartbeats renew the lease; every change
    of the node's desired state is pushed in full (level-triggered).

    Fencing: a registration makes this socket the node's only lease holder (a previous socket is told
    and closed); every later message must come from the holder with the node's current epoch. A
    malformed frame or a refused message gets an `error` reply and the link stays up; only a wrong or
    revoked token closes it.
    """

    credential_id: int | None = None
    node_name: str = ""
    node_id: int | None = None
    address: str = ""
    sent_bucket: int = -1  # the node's resend period (link.resend_bucket) when its desired state was last sent
    sent_generation: int = -1  # generation of the last desired state sent on this socket
    accepted_digest: str = ""  # digest of the last report the database took in full on this socket

    async def connect(self) -> None:
        cred = await database_sync_to_async(credentials.authenticate_agent)(_bearer(self.scope))
        if cred is None:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.credential_id, self.node_name = cred.pk, cred.node_name
        client = self.scope.get("client") or ("", 0)
        self.address = str(client[0] or "")
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.node_id is not None:
            await self.channel_layer.group_discard(agent_group(self.node_id), self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        if text_data is None:
            await self._error("bad_message", "messages are JSON text frames")
            return
        try:
            content = link.AGENT_LINK.decode(text_data)
        except WireError as exc:
            await self._error("bad_message", str(exc))
            return
        await self.receive_json(content)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        try:
            message: Any = link.AGENT_LINK.parse(content, link.AGENT_MESSAGES)
        except WireError as exc:
            message = exc
        # a frame refused as malformed does nothing and is answered at once, without the token check
        if isinstance(message, WireError):
            await self._error("bad_message", str(message))
            return
        # every other message re-checks the token; a registered socket's heartbeat, telemetry or fault does it
        # in the same trip to the database thread as the message itself (Daphne runs all of a process'
        # database work on one thread, and each trip costs a connection), a heartbeat not at all when it
        # renews in Redis: a revocation drops the node's Redis record, so the next heartbeat takes the
        # database path and its check
        in_hop = isinstance(message, (link.Heartbeat, link.TelemetryBatch, link.Fault)) and self.node_id is not None
        if not in_hop and not await database_sync_to_async(credentials.credential_is_valid)(self.credential_id):
            await self._revoked()
            return
        try:
            await self._handle(message)
        except StaleEpoch as exc:
            await self._error(exc.code, exc.message)
            await self._send_desired()  # this socket holds the lease: it resyncs to the current epoch
        except Superseded as exc:
            await self._superseded(exc.message)
        except PermissionDenied as exc:
            await self._error(exc.code, exc.message)
            await self.close(code=CLOSE_FORBIDDEN)
        except ServiceError as exc:
            await self._error(exc.code, exc.message)
        except Exception:  # a bug must not close the link with 1011: log it, answer, keep serving
            log.exception("agent message from %s failed", self.node_name)
            await self._error("internal_error", "the control plane could not process this message")

    async def _handle(self, message: Any) -> None:
        if isinstance(message, link.Register):
            await self._register(message)
            return
        if self.node_id is None:
            await self._error("not_registered", "send a register message first")
            return
        if isinstance(message, link.Heartbeat):
            with latency.HEARTBEAT_SECONDS.time():  # the whole handling: the use case, the answers, the group
                generation = await self._heartbeat(message)
                if generation is None:
                    return
                rotated = self._resend_bucket() != self.sent_bucket
                # level-triggered: a push lost on the way (e.g. Redis restarted and forgot the group) is
                # repaired by the next heartbeat of an agent still behind the node's generation
                behind = message.generation < generation and generation > self.sent_generation
                if rotated or behind:
                    await self._send_desired()
        elif isinstance(message, (link.TelemetryBatch, link.Fault)):
            record = (
                agent_reports.record_telemetry
                if isinstance(message, link.TelemetryBatch)
                else agent_reports.record_fault
            )
            if not await _service(_checked)(
                self.credential_id, record, node_id=self.node_id, message=message, channel=self.channel_name
            ):
                await self._revoked()

    async def _heartbeat(self, message: link.Heartbeat) -> int | None:
        """Renew the lease; the node's desired-state generation, or None (revoked: the socket is closed).

        A report equal to this socket's last accepted one renews in Redis on this event loop, with no
        database query and no hop to the database thread (`leases.renew_in_redis`); any other, or whenever
        Redis' record does not match, takes the database path (`heartbeat.record_heartbeat`, the token checked
        in the same hop), which also re-joins the agent group: a Redis restart empties the records too, so
        the first heartbeat after one always comes here."""
        assert self.node_id is not None
        digest = leases.report_digest(message)
        if digest == self.accepted_digest:
            generation = await leases.renew_in_redis(
                node_id=self.node_id, message=message, channel=self.channel_name, digest=digest
            )
            if generation is not None:
                return generation
        self.accepted_digest = ""
        result = await _service(_heartbeat)(
            credential_id=self.credential_id, node_id=self.node_id, message=message, channel=self.channel_name
        )
        if result is None:
            await self._revoked()
            return None
        for why in result.refused:
            await self._error("refused", why)
        if not result.refused:
            self.accepted_digest = digest
        try:  # re-join after a Redis restart
            await self.channel_layer.group_add(agent_group(self.node_id), self.channel_name)
        except Exception as exc:  # Redis down: pushes wait; the heartbeat above still renewed the lease
            log.warning("agent %s: could not re-join its group: %s", self.node_name, exc)
        return result.generation

    async def _register(self, message: link.Register) -> None:
        node, superseded = await _service(registration.register_agent)(
            credential_id=self.credential_id, message=message, channel=self.channel_name, address=self.address
        )
        # the registration is committed: a channel layer that fails now (Redis restarting) must not leave
        # this socket unregistered; the old socket is fenced by the new epoch, the group re-joined per beat
        try:
            if superseded:
                await self.channel_layer.send(superseded, {"type": "agent.superseded"})
            if self.node_id is not None and self.node_id != node.pk:
                await self.channel_layer.group_discard(agent_group(self.node_id), self.channel_name)
        except Exception as exc:
            log.warning("agent %s: could not tell its old socket: %s", message.node, exc)
        self.node_id = node.pk
        self.accepted_digest = ""  # a new epoch: no report of it was taken yet
        try:
            await self.channel_layer.group_add(agent_group(node.pk), self.channel_name)
        except Exception as exc:
            log.warning("agent %s: could not join its group, re-joins at its next heartbeat: %s", message.node, exc)
        await self.send_json(
            link.AGENT_LINK.dump(
                link.Registered(
                    node_id=node.pk,
                    epoch=node.epoch,
                    lease_s=settings.PEARL["LEASE_S"],
                    heartbeat_s=settings.PEARL["HEARTBEAT_S"],
                    weights_rotate_s=settings.PEARL["WEIGHTS_TOKEN_ROTATE_S"],
                )
            )
        )
        await self._send_desired()

    def _resend_bucket(self) -> int:
        return link.resend_bucket(settings.PEARL["WEIGHTS_TOKEN_ROTATE_S"], self.node_id or 0)

    async def _send_desired(self) -> None:
        self.sent_bucket = self._resend_bucket()
        state = await database_sync_to_async(_desired)(self.node_id, self.channel_name)
        if state is not None:
            self.sent_generation = state.generation
            await self.send_json(link.AGENT_LINK.dump(state))

    async def desired_changed(self, event: dict[str, Any]) -> None:
        await self._send_desired()

    async def agent_superseded(self, event: dict[str, Any]) -> None:
        await self._superseded("another agent socket registered for this node")

    async def _superseded(self, why: str) -> None:
        if self.node_id is not None:
            await self.channel_layer.group_discard(agent_group(self.node_id), self.channel_name)
        self.node_id = None
        await self._error("superseded", why)
        await self.close(code=link.CLOSE_SUPERSEDED)

    async def _error(self, code: str, message: str) -> None:
        await self.send_json(link.AGENT_LINK.dump(ErrorReply(code, message)))

    async def _revoked(self) -> None:
        await self._error("revoked", "this agent token was revoked")
        await self.close(code=CLOSE_UNAUTHENTICATED)


def _heartbeat(
    *, credential_id: int | None, node_id: int, message: link.Heartbeat, channel: str
) -> heartbeat.HeartbeatResult | None:
    """The token check and the heartbeat, in one call on the database thread; None: the token was revoked."""
    if credential_id is None or not credentials.credential_is_valid(credential_id):
        return None
    return heartbeat.record_heartbeat(node_id=node_id, message=message, channel=channel)


def _checked(credential_id: int | None, fn: Callable[..., Any], **kwargs: Any) -> bool:
    """The token check and a use case, in one call on the database thread; False: the token was revoked."""
    if credential_id is None or not credentials.credential_is_valid(credential_id):
        return False
    fn(**kwargs)
    return True


def _desired(node_id: int | None, channel: str) -> link.DesiredState | None:
    """The node's desired state, for the socket holding its lease only."""
    if node_id is None:  # not registered on this socket yet
        return None
    node = Node.objects.filter(pk=node_id, agent_channel=channel).first()
    return desired_state(node) if node else None


class DriverConsumer(AsyncJsonWebsocketConsumer):
    """The driver link: a job's rollout driver (the Pipeline Scheduler) and the Elastic Scheduler.

    The driver authenticates with its job's driver token; `hello` gets the job, the loop's last
    checkpoint and the serving workers; then every change of what it routes by is pushed in full
    (level-triggered). Its progress, signals, telemetry and checkpoints go to services; its job is the
    only one it may speak for. A newer driver of the same job supersedes this socket.
    """

    job_id: int | None = None
    job_name: str = ""
    ready: bool = False
    last_view: dict[str, Any] | None = None

    async def connect(self) -> None:
        job = await database_sync_to_async(credentials.authenticate_driver)(_bearer(self.scope))
        if job is None:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.job_id, self.job_name = job.pk, job.name
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.job_id is not None:
            await self.channel_layer.group_discard(driver_group(self.job_id), self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        if text_data is None:
            await self._error("bad_message", "messages are JSON text frames")
            return
        try:
            message = dl.DRIVER_LINK.parse(dl.DRIVER_LINK.decode(text_data), dl.DRIVER_MESSAGES)
        except WireError as exc:
            await self._error("bad_message", str(exc))
            return
        try:
            await self._handle(message)
        except ServiceError as exc:
            await self._error(exc.code, exc.message, exc.field or "")
        except Exception:  # a bug must not close the link with 1011: log it, answer, keep serving
            log.exception("driver message for %s failed", self.job_name)
            await self._error("internal_error", "the control plane could not process this message")

    async def _handle(self, message: Any) -> None:
        assert self.job_id is not None
        if isinstance(message, dl.Hello):
            if message.job != self.job_name:
                await self._error(
                    "not_owned", f"this token is job {self.job_name!r}'s, not {message.job[:63]!r}'s", "job"
                )
                return
            await self.channel_layer.group_send(
                driver_group(self.job_id), {"type": "driver.superseded", "by": self.channel_name}
            )
            await self.channel_layer.group_add(driver_group(self.job_id), self.channel_name)
            welcome = await database_sync_to_async(_driver_welcome)(self.job_id)
            self.ready = True
            self.last_view = dl.DRIVER_LINK.dump(welcome.cluster)
            await self.send_json(dl.DRIVER_LINK.dump(welcome))
            return
        if not self.ready:
            await self._error("not_ready", "send hello first")
            return
        actor = f"driver:{self.job_name}"
        if isinstance(message, dl.ProgressReport):
            await _service(progress.report_progress)(job_id=self.job_id, step=message.step, remaining=message.remaining)
        elif isinstance(message, dl.SignalReport):
            await _service(progress.report_signal)(
                job_id=self.job_id, signal=message.signal, remaining=message.remaining, actor=actor
            )
        elif isinstance(message, dl.TelemetryReport):
            await _service(_ingest)(self.job_id, message)
        elif isinstance(message, dl.CheckpointReport):
            await _service(progress.save_loop_checkpoint)(job_id=self.job_id, state=message.state)
        elif isinstance(message, dl.TrajectoryReport):  # agent trajectories, for the job page (issue 19)
            await _service(record_trajectories)(
                job_id=self.job_id, step=message.step, trajectories=message.trajectories
            )
        elif isinstance(message, dl.TrainedReport):  # a step's update committed: its records say so (issue 34)
            await _service(mark_trained)(job_id=self.job_id, report=message)
        elif isinstance(message, dl.UpdateRequest):
            try:
                await _service(jobs.start_update)(job_id=self.job_id, actor=actor)
            except Conflict as exc:
                await self._error("not_returned" if exc.field == "borrowed" else exc.code, exc.message, exc.field or "")
                return
            await self.send_json(dl.DRIVER_LINK.dump(dl.UpdateGranted(step=message.step)))

    async def driver_changed(self, event: dict[str, Any]) -> None:
        if not self.ready or self.job_id is None:
            return
        view = dl.DRIVER_LINK.dump(await database_sync_to_async(_driver_view)(self.job_id))
        if view != self.last_view:
            self.last_view = view
            await self.send_json(view)

    async def driver_superseded(self, event: dict[str, Any]) -> None:
        if event.get("by") != self.channel_name and self.job_id is not None:
            await self.channel_layer.group_discard(driver_group(self.job_id), self.channel_name)
            self.ready = False
            await self._error("superseded", "a newer driver of this job connected")
            await self.close(code=link.CLOSE_SUPERSEDED)

    async def _error(self, code: str, detail: str, field: str = "") -> None:
        await self.send_json(dl.DRIVER_LINK.dump(ErrorReply(error=code[:64], detail=detail[:4096], field=field[:256])))


def _driver_welcome(job_id: int) -> dl.Welcome:
    from controlplane.models import Job
    from controlplane.selectors.driver import welcome

    return welcome(Job.objects.get(pk=job_id))


def _driver_view(job_id: int) -> dl.ClusterView:
    from controlplane.models import Job
    from controlplane.selectors.driver import cluster_view

    return cluster_view(Job.objects.get(pk=job_id))


def _ingest(job_id: int, message: dl.TelemetryReport) -> int:
    from controlplane.models import Job
    from controlplane.services.principals import job_principal

    return telemetry.ingest(principal=job_principal(Job.objects.get(pk=job_id)), message=message)
