"""Channels' test communicator with a connect timeout fit for a loaded machine.

`WebsocketCommunicator.connect()` waits 1 s by default; the agent and dashboard consumers authenticate
against the database on connect, which took longer than that under load (test_sockets failed at connect
twice at load 12). The timeout is a hang guard, not a timed assertion."""

from __future__ import annotations

from channels.testing import WebsocketCommunicator as _Base

CONNECT_TIMEOUT_S = 10.0


class WebsocketCommunicator(_Base):
    async def connect(self, timeout: float = CONNECT_TIMEOUT_S):
        return await super().connect(timeout=timeout)
