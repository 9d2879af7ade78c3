"""A small process supervisor for the local launcher: start every child in its own process group,
prefix its output with its name, restart a child that dies (with backoff) instead of stopping the
stack, and on shutdown stop every group (SIGTERM, then SIGKILL).

honcho (which the launcher used before) stops everything when one process exits; supervisord or
systemd do what this does for a real deployment, but need configuration and a daemon of their own,
which a one-command local start should not.

Nothing the launcher starts outlives it, even after `kill -9`: every child is exec'd through
`python -m controlplane.management.supervisor --parent PID -- argv`, which asks the kernel for
SIGTERM when the launcher dies (PR_SET_PDEATHSIG, the mechanism the node agents use for their workers,
agents/process.py) and exits at once if it is already gone. The kernel sends that signal when the
*thread* that forked the child exits, so every child is forked by one spawner thread that lives as
long as the launcher. `hold_lock` keeps a second launcher off the same var directory and
`port_holder` names what holds a port the launcher needs.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import errno
import fcntl
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, NoReturn, TextIO

BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)
STABLE_S = 30.0  # a child that ran this long starts its backoff again from the first step
PR_SET_PDEATHSIG = 1
LOCK_FILE = "launch.lock"


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str]
    tier: int = 0  # stopped in tiers, highest first (agents before the web server before Redis)
    proc: subprocess.Popen | None = None
    restarts: int = 0
    started: float = 0.0
    next_start: float = 0.0
    failures: int = 0  # consecutive short lives
    history: list[tuple[float, int]] = field(default_factory=list)  # (time, exit code) of every death


class Supervisor:
    def __init__(
        self,
        children: list[Child],
        *,
        cwd: str,
        out: TextIO = sys.stdout,
        on_restart: Callable[[Child, int], None] | None = None,
    ) -> None:
        self.children = children
        self.cwd = cwd
        self.out = out
        self.on_restart = on_restart
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self.width = max((len(c.name) for c in children), default=4)
        # one thread forks every child, first start and restarts alike, and never exits before the
        # launcher does: the children's parent-death signal is tied to it
        self._spawner = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="spawner")

    def log(self, name: str, line: str) -> None:
        with self._lock:
            self.out.write(f"{time.strftime('%H:%M:%S')} {name:<{self.width}} | {line}\n")
            self.out.flush()

    def _pump(self, child: Child, stream: TextIO) -> None:
        for line in stream:
            self.log(child.name, line.rstrip("\n"))

    def _popen(self, child: Child) -> subprocess.Popen:
        argv = [sys.executable, "-m", __name__, "--parent", str(os.getpid()), "--", *child.argv]
        return subprocess.Popen(
            argv,
            cwd=self.cwd,
            env=child.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
        )

    def start(self, child: Child) -> None:
        child.proc = self._spawner.submit(self._popen, child).result()
        child.started = time.monotonic()
        threading.Thread(target=self._pump, args=(child, child.proc.stdout), daemon=True).start()
        self.log(child.name, f"started (pid {child.proc.pid})")

    def start_all(self) -> None:
        for c in self.children:
            self.start(c)

    def poll(self) -> None:
        """One supervision pass: note deaths, restart the dead whose backoff has passed."""
        now = time.monotonic()
        for c in self.children:
            if self.stopping.is_set():
                return
            if c.proc is not None and c.proc.poll() is not None:
                rc = c.proc.returncode
                c.history.append((time.time(), rc))
                c.failures = 0 if now - c.started >= STABLE_S else c.failures + 1
                delay = BACKOFF_S[min(max(c.failures - 1, 0), len(BACKOFF_S) - 1)]
                self.log(c.name, f"exited with {rc}; restarting in {delay:.0f} s")
                c.proc, c.next_start = None, now + delay
            if c.proc is None and now >= c.next_start:
                c.restarts += 1
                self.start(c)
                if self.on_restart:
                    self.on_restart(c, c.restarts)

    def run(self, poll_s: float = 0.5) -> None:
        while not self.stopping.wait(poll_s):
            self.poll()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Tier by tier, highest first: SIGTERM every process group of the tier (agents drain their
        workers and report while the control plane still listens), wait, then SIGKILL what is left."""
        self.stopping.set()
        for tier in sorted({c.tier for c in self.children}, reverse=True):
            members = [c for c in self.children if c.tier == tier and c.proc is not None]
            for c in members:
                if c.proc.poll() is None:  # type: ignore[union-attr]
                    _signal_group(c.proc.pid, signal.SIGTERM)  # type: ignore[union-attr]
            deadline = time.monotonic() + timeout_s
            for c in members:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    c.proc.wait(timeout=max(0.1, deadline - time.monotonic()))  # type: ignore[union-attr]
            for c in members:
                _signal_group(c.proc.pid, signal.SIGKILL)  # type: ignore[union-attr]  # nothing a child started outlives it
                c.proc.wait()  # type: ignore[union-attr]


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def hold_lock(directory: Path) -> IO[str]:
    """Take the launcher's lock on `directory` (flock on <dir>/launch.lock, which names our pid) and
    return the open file: the lock lasts as long as it stays open, and the kernel drops it when this
    process dies however it dies. Raises `AlreadyRunning` with the holder's pid if another has it."""
    directory.mkdir(parents=True, exist_ok=True)
    f = open(directory / LOCK_FILE, "a+")  # noqa: SIM115 returned open: the lock lasts while it is; not inherited by children (PEP 446): they never hold it
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        f.seek(0)
        text = f.read().strip()
        f.close()
        raise AlreadyRunning(int(text) if text.isdigit() else None, directory / LOCK_FILE) from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


class AlreadyRunning(Exception):
    def __init__(self, pid: int | None, path: Path) -> None:
        self.pid, self.path = pid, path
        super().__init__(f"another launcher (pid {pid if pid else 'unknown'}) holds {path}")


def port_free(host: str, port: int) -> bool:
    """Whether a server could listen on host:port now (bound as Daphne and Redis bind: SO_REUSEADDR,
    so a port in TIME_WAIT counts as free)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def port_holder(port: int) -> str:
    """Who listens on TCP `port` on this host, as 'pid N (command line)', from /proc; '' if unknown
    (another user's process, or not Linux)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                cols = line.split()
                if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                    inodes.add(f"socket:[{cols[9]}]")
    if not inodes:
        return ""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) in inodes for fd in (entry / "fd").iterdir()):
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                return f"pid {entry.name} ({cmd[:120]})"
    return ""


def _exec_with_parent(args: list[str]) -> NoReturn:
    """`--parent PID -- argv...`: ask for SIGTERM when PID (the launcher's spawner thread) dies, leave
    at once if it already has (a death between fork and prctl), then become argv."""
    if len(args) < 4 or args[0] != "--parent" or args[2] != "--":
        sys.exit("usage: python -m controlplane.management.supervisor --parent PID -- argv...")
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != int(args[1]):
        sys.exit("the launcher that started this process is gone")
    os.execvp(args[3], args[3:])


if __name__ == "__main__":
    _exec_with_parent(sys.argv[1:])
