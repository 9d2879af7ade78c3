"""The rollout driver's side of the driver link (`/ws/driver/`, messages in `controlplane.core.driver_link`).

One reconnecting socket (`agents.reconnect`: jittered exponential backoff, a long wait after a close that
says "give way"). Nothing is resent on reconnect that need not be: reports are level-triggered (the next
progress and checkpoint supersede a lost one), and the control plane pushes its full view on every hello.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import resource
import secrets
from pathlib import Path
from typing import Any

import orjson
from aiohttp import ClientSession, ClientTimeout, TCPConnector

from agents.driver.rollout import RolloutDriver
from agents.reconnect import reconnect_forever
from controlplane.core import driver_link as dl
from controlplane.core.wire import ErrorReply

log = logging.getLogger("pearl.driver")


class ControlLink:
    """Sends the driver's reports and hands what the control plane pushes to the driver."""

    def __init__(self, url: str, job: str, token: str, http: ClientSession) -> None:
        base = url.rstrip("/")
        self.ws_url = ("wss://" if base.startswith("https://") else "ws://") + base.split("://", 1)[1] + "/ws/driver/"
        self.job = job
        self.token = token
        self.http = http
        self.ws: Any = None
        self.incarnation = secrets.token_hex(8)
        self.welcome: asyncio.Future[dl.Welcome] = asyncio.get_running_loop().create_future()
        self.driver: RolloutDriver | None = None
        self.stopped = asyncio.Event()  # set: no reconnect after the socket closes
        self._ready = asyncio.Event()

    async def send(self, msg: Any) -> None:
        await self._ready.wait()
        await self.ws.send_str(self.encode(msg))

    @staticmethod
    def encode(msg: Any) -> str:
        """A report as its JSON frame, through the link's codec (which sends telemetry records and the
        checkpoint as they are: their fields are typed as JSON already)."""
        frame = dl.DRIVER_LINK.dump(msg)
        if isinstance(msg, dl.CheckpointReport):  # the whole state (hundreds of KiB at B·G = 1,024), every 2 s
            try:
                return orjson.dumps(frame).decode()
            except TypeError:  # what orjson does not take (a key that is not a string): as json does
                pass
        return json.dumps(frame, default=str)

    async def run_forever(self) -> None:
        """Connect, say hello, receive until the socket closes; again, with backoff, until stopped. Any
        failure of a connection (a refused handshake, a frame it cannot read) is retried, as a lost one is."""
        await reconnect_forever(
            self._connect_once, stop=self.stopped, initial_s=0.5, max_s=10.0, retry_on=(Exception,), name="driver link"
        )

    async def _connect_once(self) -> int | None:
        try:
            async with self.http.ws_connect(
                self.ws_url,
                headers={"Authorization": f"Bearer {self.token}"},
                heartbeat=30,
                max_msg_size=dl.MAX_CHECKPOINT_BYTES * 2,
            ) as ws:
                self.ws = ws
                await ws.send_str(json.dumps(dl.DRIVER_LINK.dump(dl.Hello(self.job, self.incarnation))))
                async for raw in ws:
                    self._receive(json.loads(raw.data))
                return ws.close_code
        finally:
            self._ready.clear()
            self.ws = None
            if self.driver is not None and self.driver.done.is_set():
                self.stopped.set()

    def _receive(self, data: Any) -> None:
        msg = dl.DRIVER_LINK.parse(data, dl.CONTROL_MESSAGES)
        if isinstance(msg, dl.Welcome):
            self._ready.set()
            if not self.welcome.done():
                self.welcome.set_result(msg)
            elif self.driver is not None:  # a reconnection: the view first, then what may have been lost
                self.driver.on_cluster(msg.cluster)
                self.driver.resend_unacknowledged()
        elif isinstance(msg, dl.ClusterView):
            if self.driver is not None:
                self.driver.on_cluster(msg)
        elif isinstance(msg, dl.UpdateGranted):
            if self.driver is not None:
                self.driver.on_update_granted(msg.step)
        elif isinstance(msg, ErrorReply):
            log.warning("driver link error: %s %s %s", msg.error, msg.field, msg.detail)
            if msg.field == "training_active" and self.driver is not None and self.driver.pending_train is not None:
                # the update was asked before the control plane took Training Begin (lost): both again
                asyncio.get_running_loop().call_later(0.5, self.driver.resend_unacknowledged)
            elif msg.error == "not_returned" and self.driver is not None and self.driver.pending_train is not None:
                step = self.driver.pending_train.step  # ask again once the next push shows the return
                asyncio.get_running_loop().call_later(
                    0.5, lambda: asyncio.ensure_future(self.send(dl.UpdateRequest(step)))
                )


# allocations between two collections of the young generation, per trajectory of the batch (CPython: 700 in all)
GC_YOUNG_PER_TRAJECTORY = 200


def collect_less(trajectories: int) -> None:
    """The cyclic collector, tuned for a driver holding `trajectories` (B·G) with a turn each in flight.

    A young collection scans every tracked object still alive, and with B·G turns in flight that is
    what B·G turns hold: at CPython's threshold (700 allocations) the collector cost more CPU per turn
    than the loop at B·G = 1,024, and more the more trajectories (gc callbacks in
    benchmarks/bench_driver.py). Collecting every `GC_YOUNG_PER_TRAJECTORY` · B·G allocations (50,000 at
    least) keeps the scans per turn from growing with B·G; what was imported and built before the run is
    frozen out of them. Reference counting still frees at once everything that is not in a cycle."""
    gc.freeze()
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(young, 50_000, GC_YOUNG_PER_TRAJECTORY * trajectories), middle, old)


def _allow_sockets(n: int) -> None:
    """Raise the soft limit on open files towards `n` (a socket per trajectory's turn), as the hard limit allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = n if hard == resource.RLIM_INFINITY else min(n, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit to %d: %r", want, exc)


async def run_driver(
    url: str, job: str, token: str, *, time_factor: float = 1.0, state_dir: Path | None = None
) -> RolloutDriver:
    """Connect, take the job and the loop's checkpoint from the welcome, run the driver until the job stops
    (`state_dir`: the driver's own directory, where it journals its trajectories' turns)."""
    _allow_sockets(4096)
    # no cap on connections: every trajectory may have its turn in flight (aiohttp's default of 100 held
    # B·G = 1,024 trajectories to 100 turns at once, whatever the engines could batch)
    async with ClientSession(timeout=ClientTimeout(total=600), connector=TCPConnector(limit=0)) as http:
        link = ControlLink(url, job, token, http)
        link_task = asyncio.create_task(link.run_forever())
        welcome = await link.welcome
        collect_less(welcome.job.batch_size)
        driver = RolloutDriver(
            welcome.job,
            link=link,
            token=welcome.dataplane_token,
            time_factor=time_factor,
            checkpoint=welcome.checkpoint or None,
            http=http,
            state_dir=state_dir,
        )
        driver.cluster = welcome.cluster
        link.driver = driver
        try:
            await driver.run()
        finally:
            link.stopped.set()
            link_task.cancel()
        return driver
