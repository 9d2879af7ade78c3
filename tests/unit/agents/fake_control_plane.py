"""A minimal in-test agent-link server, ONLY for the agent's reconnect and fencing logic.

The real `/ws/agent/` consumer is tested against the agent in tests/integration/agents.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import WSMsgType, web

from controlplane.core import agent_link as link


class FakeControlPlane:
    def __init__(self, token: str = "node-token") -> None:
        self.token = token
        self.received: list[dict[str, Any]] = []
        self.connections = 0
        self.sockets: list[web.WebSocketResponse] = []
        self.epoch = 1
        self.heartbeat_s = 0.1
        self.desired: dict[str, Any] | None = None
        self.event = asyncio.Event()
        self.runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/ws/agent/", self.ws)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        for ws in list(self.sockets):
            await ws.close()
        if self.runner:
            await self.runner.cleanup()

    async def ws(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.Response(status=403)
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self.connections += 1
        self.sockets.append(ws)
        async for msg in ws:
            if msg.type != WSMsgType.TEXT:
                continue
            data = json.loads(msg.data)
            link.AGENT_LINK.parse(data, link.AGENT_MESSAGES)  # the agent must speak the protocol exactly
            self.received.append(data)
            self.event.set()
            if data["type"] == "register":
                await ws.send_json(
                    link.AGENT_LINK.dump(
                        link.Registered(node_id=7, epoch=self.epoch, lease_s=10, heartbeat_s=self.heartbeat_s)
                    )
                )
                if self.desired is not None:
                    await ws.send_json(self.desired)
        self.sockets.remove(ws)
        return ws

    async def push(self, desired: link.DesiredState) -> None:
        self.desired = link.AGENT_LINK.dump(desired)
        for ws in self.sockets:
            await ws.send_json(self.desired)

    async def push_raw(self, data: dict[str, Any]) -> None:
        for ws in self.sockets:
            await ws.send_json(data)

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.received if m["type"] == kind]

    async def wait_for(self, predicate: Any, timeout: float = 60.0) -> Any:
        """Wait until predicate(self) is truthy; returns its value."""

        async def loop() -> Any:
            while True:
                value = predicate(self)
                if value:
                    return value
                self.event.clear()
                with __import__("contextlib").suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.event.wait(), 0.5)

        return await asyncio.wait_for(loop(), timeout)
