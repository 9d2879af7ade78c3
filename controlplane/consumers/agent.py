"""The agent link's socket (`/ws/agent/`): a node agent registers, heartbeats (its lease) and reports faults and
telemetry; the node's desired state is pushed to it in full on every change (level-triggered)."""

from __future__ import annotations

import logging
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from controlplane.consumers.common import CLOSE_FORBIDDEN, CLOSE_UNAUTHENTICATED, bearer_token, service
from controlplane.core import agent_link as link
from controlplane.core.wire import ErrorReply, WireError
from controlplane.selectors.cluster import agent_desired_state
from controlplane.services import agent_reports, credentials, heartbeat, latency, leases, registration
from controlplane.services.errors import PermissionDenied, ServiceError, StaleEpoch, Superseded
from controlplane.services.events import agent_group

log = logging.getLogger(__name__)


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
        # on this event loop (a Redis read), not the database thread: a handshake that queues there behind a
        # storm of registrations outlives Daphne's connect timeout, and its retry lengthens the queue
        cred = await credentials.authenticate_agent_async(bearer_token(self.scope))
        if cred is None:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.credential_id, self.node_name = cred
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
        # every other message re-checks the token; a registration, and a registered socket's heartbeat,
        # telemetry or fault, do it in the same trip to the database thread as the message itself (Daphne
        # runs all of a process' database work on one thread, and each trip costs a connection), a heartbeat
        # not at all when it renews in Redis: a revocation drops the node's Redis record, so the next
        # heartbeat takes the database path and its check
        in_hop = isinstance(message, link.Register) or (
            isinstance(message, (link.Heartbeat, link.TelemetryBatch, link.Fault)) and self.node_id is not None
        )
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
            recorded = await service(agent_reports.record_agent_report)(
                credential_id=self.credential_id, node_id=self.node_id, message=message, channel=self.channel_name
            )
            if not recorded:
                await self._revoked()

    async def _heartbeat(self, message: link.Heartbeat) -> int | None:
        """Renew the lease; the node's desired-state generation, or None (revoked: the socket is closed).

        A report equal to this socket's last accepted one renews in Redis on this event loop, with no
        database query and no hop to the database thread (`leases.renew_in_redis`); any other, or whenever
        Redis' record does not match, takes the database path (`heartbeat.record_agent_heartbeat`, the token
        checked in the same hop), which also re-joins the agent group: a Redis restart empties the records too, so
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
        result = await service(heartbeat.record_agent_heartbeat, waited=leases.note_link_wait)(
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
        registered = await service(registration.register_agent_socket, waited=leases.note_link_wait)(
            credential_id=self.credential_id, message=message, channel=self.channel_name, address=self.address
        )
        if registered is None:
            await self._revoked()
            return
        node, superseded, state = registered
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
        await self._send_state(state)  # read in the registration's trip to the database thread

    def _resend_bucket(self) -> int:
        return link.resend_bucket(settings.PEARL["WEIGHTS_TOKEN_ROTATE_S"], self.node_id or 0)

    async def _send_desired(self) -> None:
        state = (  # not registered on this socket yet: nothing to send
            None
            if self.node_id is None
            else await database_sync_to_async(agent_desired_state)(self.node_id, self.channel_name)
        )
        await self._send_state(state)

    async def _send_state(self, state: link.DesiredState | None) -> None:
        self.sent_bucket = self._resend_bucket()
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
