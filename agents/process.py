"""Spawning and stopping worker processes (used by the node agent and by tests)."""
from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

READY = "PEARL_WORKER_READY "
REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class WorkerProcess:
    worker_id: int
    proc: asyncio.subprocess.Process
    port: int
    secret: str
    state_dir: Path
    args: list[str] = field(default_factory=list)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def stop(self, timeout_s: float = 15.0) -> int:
        """SIGTERM (the worker drains and journals its aborted requests), then SIGKILL."""
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout_s)
            except asyncio.TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        await self.reap()
        return self.proc.returncode or 0

    async def reap(self) -> None:
        """After exit: read the pipe to EOF so the transport closes (no leaked file descriptors)."""
        await self.proc.wait()
        if self.proc.stdout is not None:
            try:
                await asyncio.wait_for(self.proc.stdout.read(), 5)
            except (asyncio.TimeoutError, OSError):
                pass
        transport = getattr(self.proc, "_transport", None)
        if transport is not None:
            transport.close()

    def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()


async def spawn_worker(
    *, worker_id: int, engine: str, role: str, state_dir: Path, model: str = "tiny", job: str = "",
    hardware: str = "H800", time_factor: float = 1.0, secret: str | None = None, extra: list[str] | None = None,
    startup_timeout_s: float = 120.0, module: str = "agents.worker", env_extra: dict[str, str] | None = None,
) -> WorkerProcess:
    """Start `python -m agents.worker` on an ephemeral loopback port and wait until it serves."""
    secret = secret or secrets.token_urlsafe(32)
    state_dir.mkdir(parents=True, exist_ok=True)
    args = [
        sys.executable, "-m", module, "--engine", engine, "--role", role, "--worker-id", str(worker_id),
        "--model", model, "--job", job, "--hardware", hardware, "--time-factor", str(time_factor),
        "--state-dir", str(state_dir), *(extra or []),
    ]
    env = dict(os.environ, PEARL_WORKER_SECRET=secret, **(env_extra or {}))  # env, not argv: not visible in `ps`
    for leak in ("PEARL_AGENT_TOKEN", "PEARL_DATAPLANE_SECRET"):  # a worker never needs the agent's secrets
        env.pop(leak, None)
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with open(state_dir / "stderr.log", "ab") as errors:  # the child keeps its own descriptor
        proc = await asyncio.create_subprocess_exec(
            *args, env=env, cwd=str(REPO_ROOT), stdout=asyncio.subprocess.PIPE, stderr=errors,
        )
    assert proc.stdout is not None
    try:
        while True:
            line = await asyncio.wait_for(proc.stdout.readline(), startup_timeout_s)
            if not line:
                err = (state_dir / "stderr.log").read_text()[-2000:]
                raise RuntimeError(f"worker {worker_id} exited before serving: {err}")
            text = line.decode(errors="replace")
            if text.startswith(READY):
                port = int(json.loads(text[len(READY):])["port"])
                break
    except BaseException:
        if proc.returncode is None:
            proc.kill()
        raise
    return WorkerProcess(worker_id, proc, port, secret, state_dir, args)


async def serve_until_signal(app: Any, host: str, port: int) -> tuple[Any, int, asyncio.Event]:
    """Start an aiohttp app on host:port (0 = any free port); returns (runner, bound port, stop),
    where `stop` is set by SIGTERM or SIGINT. The caller finishes its work and cleans the runner up."""
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return runner, bound, stop
