"""The node agent's session with the control plane: registration, the epoch and generation fencing of
every desired state, the agent link (one websocket, reconnected with jittered backoff), heartbeats and
telemetry, and the agent's own data plane (GET /workers, for the job's rollout driver). The reconciling
half is `agents.node.reconciler.Reconciler`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import uuid
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import ClientSession, ClientTimeout, WSMsgType, web

from agents.node.config import AgentConfig
from agents.node.reconciler import WEIGHTS_WATCH_S, DriverProcess, Managed, Reconciler, partials
from agents.process import kill_leftovers, serve_app
from agents.reconnect import HANDSHAKE_TIMEOUT_S, reconnect_forever
from controlplane.core import agent_link as link
from controlplane.core.state import Pool
from controlplane.core.wire import ErrorReply, WireError, to_json

log = logging.getLogger("pearl.agent")

HW_MEMORY_MB = {"h800": 81920, "h100": 81920, "h200": 144384, "h20": 98304, "cpu": 4096}
RECONNECT_BACKOFF_MAX_S = 30.0


class NodeAgent(Reconciler):
    """One node's agent: its session with the control plane (here) and its reconciler (the mixin)."""

    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self.incarnation = uuid.uuid4().hex
        self.epoch = 0
        self.generation = -1  # last applied desired-state generation
        self.desired: link.DesiredState | None = None
        self.workers: dict[int, Managed] = {}
        self.heartbeat_s = 5.0
        self.weights_rotate_s = 300.0
        self.node_id: int | None = None
        self.leftovers: list[dict[str, Any]] = []  # workers a previous incarnation left running, killed at start
        self.rejected: list[str] = []  # why desired states were refused (for tests and logs)
        self.outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.pending_telemetry: list[dict[str, Any]] = []  # the agent's own records (toggles)
        self.connected = asyncio.Event()
        self.superseded = False  # this connection was superseded by another socket for the node
        self.stopping = asyncio.Event()
        self._kick = asyncio.Event()
        self._beat = asyncio.Event()
        self.drivers: dict[str, DriverProcess] = {}  # job -> the rollout driver this agent runs for it
        self._http: ClientSession | None = None
        self._dp_runner: web.AppRunner | None = None
        self.dataplane_url = ""
        self._reconcile_lock = asyncio.Lock()
        self._asking: dict[tuple[str, int], asyncio.Task[None]] = {}

    # ------------------------------------------------------------ link messages
    def register_message(self) -> link.Register:
        mem = self.cfg.memory_mb or HW_MEMORY_MB.get(self.cfg.hardware.lower(), 81920)
        slots = [link.SlotSpec(index=i, hardware=self.cfg.hardware, memory_mb=mem) for i in range(self.cfg.slots)]
        return link.Register(
            node=self.cfg.node,
            pool=Pool(self.cfg.pool),
            hardware=self.cfg.hardware,
            slots=slots,
            incarnation=self.incarnation,
            engine=self.cfg.engine,
            data_plane=self.dataplane_url,
        )

    def heartbeat_message(self) -> link.Heartbeat:
        return link.Heartbeat(
            epoch=self.epoch,
            generation=max(self.generation, 0),
            workers=[m.observed() for m in sorted(self.workers.values(), key=lambda m: m.desired.worker_id)],
        )

    def send(self, message: Any) -> None:
        self.outbox.put_nowait(link.AGENT_LINK.dump(message))

    def on_control(self, data: Any) -> None:
        """Handle one control-plane message (already JSON-decoded)."""
        try:
            msg = link.AGENT_LINK.parse(data, link.CONTROL_MESSAGES)
        except WireError as exc:
            log.warning("bad message from the control plane: %s", exc)
            return
        if isinstance(msg, link.Registered):
            if msg.epoch < self.epoch:
                self._refuse(f"registered with epoch {msg.epoch} < current {self.epoch}")
                return
            self.epoch, self.node_id = msg.epoch, msg.node_id
            self.heartbeat_s = max(0.05, msg.heartbeat_s)
            self.weights_rotate_s = msg.weights_rotate_s
            self._report_leftovers()
        elif isinstance(msg, link.DesiredState):
            self.apply(msg)
        elif isinstance(msg, ErrorReply):
            log.warning("control plane error %s: %s", msg.error, msg.detail)
            if msg.error == "superseded":
                self.superseded = True
            # this socket's registration did not take (its channel layer failed while Redis restarted): register
            # again, unless another socket took the node over (two agents of one node must not take turns)
            elif msg.error == "not_registered" and not self.superseded:
                self.send(self.register_message())

    def apply(self, msg: link.DesiredState) -> bool:
        """Fence, then adopt the desired state (reconciliation runs asynchronously)."""
        if msg.epoch < self.epoch:
            self._refuse(f"desired state generation {msg.generation} has stale epoch {msg.epoch} < {self.epoch}")
            return False
        if msg.generation < self.generation:
            self._refuse(f"desired state generation {msg.generation} < last applied {self.generation}")
            return False
        self.epoch = msg.epoch
        self.generation = msg.generation
        self.desired = msg
        self.abandon_starts(msg)
        self._kick.set()
        return True

    def _report_leftovers(self) -> None:
        """Once registered: report the workers the previous incarnation left, with their journaled partials."""
        for x in self.leftovers:
            aborted = partials(x["aborted"], x["worker_id"])
            self.send(
                link.Fault(
                    epoch=self.epoch,
                    worker_id=x["worker_id"],
                    kind="orphan_killed" if x["was_running"] else "orphan_gone",
                    detail=f"pid {x['pid']} of a previous agent incarnation",
                    aborted=aborted,
                )
            )
        self.leftovers = []

    async def _kill_leftovers(self) -> None:
        self.leftovers = await asyncio.to_thread(kill_leftovers, self.cfg.state_dir)
        if self.leftovers:
            log.warning(
                "found %d worker(s) of a previous agent incarnation; killed the %d still running",
                len(self.leftovers),
                sum(x["was_running"] for x in self.leftovers),
            )

    def _refuse(self, why: str) -> None:
        log.warning("refused: %s", why)
        self.rejected.append(why)
        self.send(link.Fault(epoch=self.epoch, worker_id=0, kind="stale_command", detail=why))

    # ------------------------------------------------------------ the connection
    @property
    def ws_url(self) -> str:
        base = self.cfg.control_plane.rstrip("/")
        if base.startswith("http"):
            base = "ws" + base[4:]
        return base if base.endswith("/ws/agent") else base + "/ws/agent/"

    async def run(self) -> None:
        """Connect, serve, reconnect with jittered exponential backoff until stopped."""
        async with self.serving():
            await reconnect_forever(
                self._connect_once, stop=self.stopping, max_s=RECONNECT_BACKOFF_MAX_S, name="agent link"
            )

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        """The agent's services for one run, connected or standalone: what a previous incarnation left is
        killed first, then its data plane, reconciler and crash monitor run until the block ends, which
        drains and stops the workers."""
        self._http = ClientSession(timeout=ClientTimeout(total=600))
        await self._kill_leftovers()
        await self._start_dataplane()
        tasks = [asyncio.create_task(self._reconcile_loop()), asyncio.create_task(self._monitor_loop())]
        try:
            yield
        finally:
            await self._teardown(tasks)

    async def _teardown(self, tasks: list[asyncio.Task]) -> None:
        """Stop the background tasks, drain and stop the workers, close the data plane and the client."""
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.shutdown_workers(self.cfg.drain_timeout_s)
        if self._dp_runner:
            await self._dp_runner.cleanup()
        if self._http is not None:
            await self._http.close()

    async def _connect_once(self) -> int | None:
        """One connection, until it closes; returns the close code."""
        assert self._http is not None
        headers = {"Authorization": f"Bearer {self.cfg.token}"}
        async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):  # not the client's 600 s: a loaded server is retried later
            ws = await self._http.ws_connect(
                self.ws_url, headers=headers, heartbeat=30, max_msg_size=link.MAX_MESSAGE_BYTES
            )
        async with ws:
            await ws.send_json(link.AGENT_LINK.dump(self.register_message()))
            self.superseded = False
            self.connected.set()
            sender = asyncio.create_task(self._send_loop(ws))
            beat = asyncio.create_task(self._heartbeat_loop())
            stop = asyncio.create_task(self.stopping.wait())
            try:
                while True:
                    recv = asyncio.create_task(ws.receive())
                    done, _ = await asyncio.wait({recv, stop, sender}, return_when=asyncio.FIRST_COMPLETED)
                    if recv not in done:
                        recv.cancel()
                        if stop in done:  # graceful: drain while still connected, report, then close
                            sender.cancel()
                            beat.cancel()
                            await asyncio.gather(sender, beat, return_exceptions=True)
                            await self.shutdown_workers(self.cfg.drain_timeout_s)
                            while not self.outbox.empty():
                                await ws.send_json(self.outbox.get_nowait())
                            await ws.send_json(link.AGENT_LINK.dump(self.heartbeat_message()))
                        break
                    msg = recv.result()
                    if msg.type == WSMsgType.TEXT:
                        try:
                            data = json.loads(msg.data)
                        except ValueError:
                            log.warning("non-JSON message from the control plane")
                            continue
                        self.on_control(data)
                    elif msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSED, WSMsgType.CLOSING, WSMsgType.ERROR):
                        break
            finally:
                self.connected.clear()
                for t in (sender, beat, stop):
                    t.cancel()
                await asyncio.gather(sender, beat, stop, return_exceptions=True)
        return ws.close_code

    async def _send_loop(self, ws: Any) -> None:
        while True:
            item = await self.outbox.get()
            try:
                await ws.send_json(item)
            except Exception:
                self.outbox.put_nowait(item)  # keep it for the next connection
                raise

    async def _heartbeat_loop(self) -> None:
        while True:
            if self.epoch == 0:  # not registered yet: a heartbeat without an epoch would be refused as stale
                await asyncio.sleep(0.05)
                continue
            reconciled = self._beat.is_set()
            self._beat.clear()  # a reconcile that finishes from here on is reported by the next beat
            # the workers' answers are waited for half a period at most each, so that the beats (the lease)
            # come at most 1.5 periods apart whatever the workers do; a late answer goes with a later beat
            if not reconciled:  # a reconcile recorded what it changed: its report (a return against
                await self._observe(self.heartbeat_s / 2)  # its deadline) does not wait for every worker's answer
            self.send(self.heartbeat_message())
            loop = asyncio.get_running_loop()
            until = loop.time() + self.heartbeat_s
            records = await self._collect_telemetry(self.heartbeat_s / 2)
            for i in range(0, len(records), link.MAX_TELEMETRY_RECORDS):
                self.send(link.TelemetryBatch(epoch=self.epoch, records=records[i : i + link.MAX_TELEMETRY_RECORDS]))
            while (left := until - loop.time()) > 0:  # report as soon as a reconcile changed something, or
                with contextlib.suppress(asyncio.TimeoutError):  # a trainer here published new weights
                    await asyncio.wait_for(self._beat.wait(), min(left, WEIGHTS_WATCH_S))
                if self._beat.is_set() or await self._trainer_published():
                    break

    # ------------------------------------------------------------ the agent's own data plane
    async def _start_dataplane(self) -> None:
        """GET /workers: endpoints and secrets of this node's workers, for the job's rollout driver."""
        if not self.cfg.dataplane_secret:
            return
        secret = self.cfg.dataplane_secret

        async def workers(request: web.Request) -> web.Response:
            header = request.headers.get("Authorization", "")
            if not (header.startswith("Bearer ") and secrets.compare_digest(header[7:].encode(), secret.encode())):
                return web.json_response({"error": "missing or bad data-plane secret"}, status=401)
            return web.json_response(
                {
                    "workers": [
                        {**to_json(m.observed()), "secret": m.proc.secret if m.proc else ""}
                        for m in self.workers.values()
                    ]
                }
            )

        app = web.Application()
        app.router.add_get("/workers", workers)
        self._dp_runner, port = await serve_app(app, self.cfg.bind_address, self.cfg.dataplane_port)
        self.dataplane_url = f"http://{self.cfg.advertised_host}:{port}"
