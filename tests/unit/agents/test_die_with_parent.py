"""A process an agent starts dies with the agent (`agents.process.die_with_parent`), also where the agent was
started with SIGHUP ignored (`nohup`), which every child inherits through exec: a rollout driver, which installs
no SIGHUP handler, outlived its SIGKILLed agent that way (the crash suite's teardown found it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from agents.process import PARENT_ENV, start_time
from tests.support.environment import ROOT

CHILD = (
    "from agents.process import die_with_parent; die_with_parent(); import time; "
    "print('ready', flush=True); time.sleep(120)"
)
# the agent's part: SIGHUP ignored as under nohup, its pid in the child's environment (child_env), the child started
AGENT = f"""
import os, signal, subprocess, sys
signal.signal(signal.SIGHUP, signal.SIG_IGN)
env = dict(os.environ, {PARENT_ENV}=str(os.getpid()))
child = subprocess.Popen([sys.executable, "-c", {CHILD!r}], env=env, start_new_session=True)
print(child.pid, flush=True)
signal.pause()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_dies_with_its_agent_even_when_sighup_was_ignored() -> None:
    agent = subprocess.Popen(
        [sys.executable, "-c", AGENT],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert agent.stdout is not None
        child = int(agent.stdout.readline())
        assert agent.stdout.readline().strip() == "ready"  # the child passed die_with_parent (it shares the pipe)
        assert start_time(child) is not None
        agent.kill()
        agent.wait()
        deadline = time.monotonic() + 20
        while start_time(child) is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        alive = start_time(child) is not None
        if alive:
            os.kill(child, signal.SIGKILL)
        assert not alive, "the child outlived its agent"
    finally:
        if agent.poll() is None:
            agent.kill()
