"""Crash points (agents/crash.py): off by default, a SIGKILL of the process at the named point, once with a flag
file, after n passes with PEARL_CRASH_AFTER."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.environment import ROOT

SCRIPT = """from agents.crash import crash_point
for _ in range(3):
    crash_point("trainer.mid_update")
    print("passed", flush=True)
"""


def run(**env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("PEARL_CRASH")}
    return subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, env=base | env, capture_output=True, text=True, timeout=60
    )


def test_off_by_default_and_for_another_point() -> None:
    assert run().stdout.count("passed") == 3
    assert run(PEARL_CRASH_AT="driver.after_update").stdout.count("passed") == 3


def test_the_named_point_kills_the_process_once_with_a_flag(tmp_path: Path) -> None:
    flag = tmp_path / "crashed"
    first = run(PEARL_CRASH_AT="trainer.mid_update", PEARL_CRASH_FLAG=str(flag))
    assert first.returncode == -signal.SIGKILL and first.stdout == ""
    assert flag.read_text() == "trainer.mid_update"
    again = run(PEARL_CRASH_AT="trainer.mid_update", PEARL_CRASH_FLAG=str(flag))  # the restarted process
    assert again.returncode == 0 and again.stdout.count("passed") == 3


def test_after_n_passes() -> None:
    out = run(PEARL_CRASH_AT="trainer.mid_update", PEARL_CRASH_AFTER="2")
    assert out.returncode == -signal.SIGKILL and out.stdout.count("passed") == 2
