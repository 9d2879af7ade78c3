"""Servers the tests start as real subprocesses (Daphne, Celery, agents): ports, start and stop, and what a
worker left in its state directory."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from tests.support.environment import ROOT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_port(port: int, timeout: float = 30.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Return once something listens on `port`; fail early if `proc` exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before port {port} opened")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"port {port} did not open within {timeout}s")


def start_process(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Start `cmd` from the repository root in its own session, its output in `log`."""
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
    )


def stop_processes(procs: Sequence[subprocess.Popen[bytes]], grace_s: float = 10.0) -> None:
    """Terminate (SIGTERM), then kill what is still running after `grace_s` for them all (a node agent's
    SIGTERM stops its workers and drivers first: give it a minute)."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()


def journaled_tokens(state_dir: Path) -> bool:
    """The worker's in-flight journal holds requests, each with some generated tokens."""
    try:
        entries = json.loads((state_dir / "inflight.json").read_text())["inflight"]
    except (OSError, ValueError, KeyError):
        return False
    return bool(entries) and all(e.get("tokens") for e in entries)
