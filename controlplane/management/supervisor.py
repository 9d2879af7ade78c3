"""A small process supervisor for the local launcher: start every child in its own process group,
prefix its output with its name, restart a child that dies (with backoff) instead of stopping the
stack, and on shutdown stop every group (SIGTERM, then SIGKILL).

honcho (which the launcher used before) stops everything when one process exits; supervisord or
systemd do what this does for a real deployment, but need configuration and a daemon of their own,
which a one-command local start should not.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, TextIO

BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)
STABLE_S = 30.0  # a child that ran this long starts its backoff again from the first step


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
    def __init__(self, children: list[Child], *, cwd: str, out: TextIO = sys.stdout,
                 on_restart: Callable[[Child, int], None] | None = None) -> None:
        self.children = children
        self.cwd = cwd
        self.out = out
        self.on_restart = on_restart
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self.width = max((len(c.name) for c in children), default=4)

    def log(self, name: str, line: str) -> None:
        with self._lock:
            self.out.write(f"{time.strftime('%H:%M:%S')} {name:<{self.width}} | {line}\n")
            self.out.flush()

    def _pump(self, child: Child, stream: TextIO) -> None:
        for line in stream:
            self.log(child.name, line.rstrip("\n"))

    def start(self, child: Child) -> None:
        child.proc = subprocess.Popen(child.argv, cwd=self.cwd, env=child.env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
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
