"""A step's B·G trajectories (or their agents) connect at once: the servers they reach queue them.

Past listen(2)'s backlog the kernel drops a SYN and the client retries it a second later (seen as a
1 s p95 in benchmarks/bench_gateway.py at 1,024 sessions with aiohttp's default backlog of 128)."""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from pathlib import Path

import pytest
from aiohttp import web

from agents.dataplane import LISTEN_BACKLOG
from agents.gateway.app import Gateway, serve
from agents.gateway.backends import WorkerBackend
from agents.gateway.chat import ByteChatFormat
from agents.process import serve_until_signal

AT_ONCE = 600  # well past aiohttp's default backlog (128), under a default 1,024 open files


def somaxconn() -> int:
    return int(Path("/proc/sys/net/core/somaxconn").read_text())


pytestmark = pytest.mark.skipif(
    somaxconn() < AT_ONCE, reason="net.core.somaxconn caps every listen backlog below the batch here"
)


def connected_at_once(port: int) -> int:
    """Connect AT_ONCE sockets without yielding to the event loop, so the server accepts none of them:
    the ones the kernel queued are connected, the ones whose SYN it dropped are still connecting."""
    socks = []
    try:
        for _ in range(AT_ONCE):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            socks.append(s)
        time.sleep(0.3)  # loopback handshakes complete in the kernel
        n = 0
        for s in socks:
            try:
                s.getpeername()
                n += 1
            except OSError:
                pass
        return n
    finally:
        for s in socks:
            s.close()


async def test_the_gateway_queues_a_whole_batch_of_agents_connecting_at_once():
    assert LISTEN_BACKLOG >= 1024
    backend = WorkerBackend(["http://127.0.0.1:1"], "unused", http=None)  # no turn is asked for
    runner, base = await serve(Gateway(ByteChatFormat(), backend))
    try:
        assert connected_at_once(int(base.rsplit(":", 1)[1])) == AT_ONCE
    finally:
        await runner.cleanup()


async def test_engine_workers_and_trainers_queue_a_whole_batch_connecting_at_once():
    runner, port, _stop = await serve_until_signal(web.Application(), "127.0.0.1", 0)
    try:
        assert connected_at_once(port) == AT_ONCE
    finally:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        await runner.cleanup()
