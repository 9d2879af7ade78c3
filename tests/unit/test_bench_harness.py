"""The control-plane benchmarks' process harness (benchmarks/harness.py): its Redis answers and is gone once
stopped, a child that ignores SIGTERM is killed after the grace, and the /proc readings see a busy process."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))  # the harness imports bench_controlplane, a script beside it
_spec = importlib.util.spec_from_file_location("harness", BENCHMARKS / "harness.py")
assert _spec is not None and _spec.loader is not None
harness = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(harness)


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_its_redis_answers_and_stop_ends_it() -> None:
    import redis

    proc, port = harness.start_redis()
    try:
        assert redis.Redis(port=port).ping()
    finally:
        harness.stop([proc])
    assert proc.poll() is not None


def test_stop_kills_a_child_that_ignores_sigterm(monkeypatch: pytest.MonkeyPatch) -> None:
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "up"
    waits: list[float | None] = []
    real_wait = subprocess.Popen.wait

    def short_wait(self: subprocess.Popen[str], timeout: float | None = None) -> int:  # the 30 s grace, shortened
        waits.append(timeout)
        return real_wait(self, timeout=None if timeout is None else min(timeout, 0.5))

    monkeypatch.setattr(subprocess.Popen, "wait", short_wait)
    harness.stop([child])
    assert child.returncode == -signal.SIGKILL and waits[0] == 30


def test_proc_readings_see_this_process() -> None:
    before = harness.cpu_s(os.getpid())
    end = time.process_time() + 0.05
    while time.process_time() < end:
        pass
    assert harness.cpu_s(os.getpid()) > before
    assert harness.rss_mb(os.getpid()) > 10
    assert harness.cpu_s(2**22 + 1) == 0.0 and harness.rss_mb(2**22 + 1) == 0.0  # no such process
