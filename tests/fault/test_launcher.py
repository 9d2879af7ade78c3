"""The one-command launcher under faults: a killed agent is restarted and the stack stays up; SIGTERM
stops every process it started, workers included; it runs in production mode (DEBUG off) by default.
And `check --deploy` is clean under the documented production settings."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from controlplane.management.commands.launch import DEMO_NODES
from tests.fault.conftest import processes_under, record_timing, wait_for
from tests.support.environment import ROOT
from tests.support.processes import free_port

pytestmark = [pytest.mark.slow]


def get(url: str, token: str | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url, headers={"Authorization": f"Token {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")
    except OSError:
        return 0, {}


def agent_pid(var: Path, name: str) -> int | None:
    for pid in processes_under(var / "agents" / name):
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        if b"agents.node" in cmd:
            return pid
    return None


def test_launcher_restarts_a_dead_agent_and_stops_everything(tmp_path):
    var, port, redis_port = tmp_path / "var", free_port(), free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "DEBUG", "PEARL_TESTING", "SECRET_KEY", "DJANGO_ALLOW_ASYNC_UNSAFE")
    }
    env |= {
        "PEARL_VAR_DIR": str(var),
        "PEARL_PORT": str(port),
        "REDIS_URL": f"redis://127.0.0.1:{redis_port}",
        "PEARL_LEASE_S": "4",
        "PEARL_HEARTBEAT_S": "0.5",
        "PYTHONPATH": str(ROOT),
    }
    with open(tmp_path / "launch.log", "wb") as log:
        launcher = subprocess.Popen(
            [sys.executable, "manage.py", "launch", "--no-demo-job", "--time-factor", "0.01", "--trace", ""],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(
            lambda: b"PEARL is up" in (tmp_path / "launch.log").read_bytes() or launcher.poll() is not None,
            180,
            "the stack to come up",
        )
        assert launcher.poll() is None, (tmp_path / "launch.log").read_text()[-3000:]
        token = json.loads((var / "demo-credentials.json").read_text())["token"]
        assert (var / "secret_key").exists() and oct((var / "secret_key").stat().st_mode & 0o777) == "0o600"
        # production mode: an unknown page is the JSON 404 of handler404 (DEBUG would show its HTML page)
        assert get(f"{base}/no-such-page") == (
            404,
            {"error": "not_found", "field": None, "detail": "no such URL: /no-such-page"},
        )
        nodes = {n["name"]: n for n in get(f"{base}/api/nodes/", token)[1]["results"]}
        assert len(nodes) == len(DEMO_NODES) and all(n["status"] == "ready" for n in nodes.values())

        victim = agent_pid(var, "spot-0")
        assert victim
        t_kill = time.time()
        os.kill(victim, signal.SIGKILL)
        # the stack stays up while the agent comes back as a new incarnation (a new epoch)
        back = wait_for(
            lambda: (
                (n := {x["name"]: x for x in get(f"{base}/api/nodes/", token)[1].get("results", [])}.get("spot-0"))
                and n["epoch"] > nodes["spot-0"]["epoch"]
                and n["status"] == "ready"
                and n
            ),
            60,
            "the agent to come back",
        )
        record_timing("launcher_agent_kill9", recover_s=time.time() - t_kill)
        assert agent_pid(var, "spot-0") not in (None, victim)
        assert get(f"{base}/healthz")[0] == 200 and launcher.poll() is None
        assert back["status"] == "ready"
    finally:
        if launcher.poll() is None:
            launcher.send_signal(signal.SIGTERM)
        rc: int | None
        try:
            rc = launcher.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(launcher.pid, signal.SIGKILL)
            rc = None
        left = processes_under(var)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    assert rc == 0, (tmp_path / "launch.log").read_text()[-3000:]
    assert not left, f"processes outlived the launcher: {left}"
    assert get(f"{base}/healthz")[0] == 0  # nothing listens any more


@pytest.mark.parametrize("production, ok", [(True, True), (False, False)])
def test_check_deploy_is_clean_under_the_documented_production_settings(tmp_path, production, ok):
    leave_out = (
        "DEBUG",
        "PEARL_TESTING",
        "SECRET_KEY",
        "PEARL_HTTPS",
        "DJANGO_ALLOW_ASYNC_UNSAFE",
    )  # the last: set by the test tools
    env = {k: v for k, v in os.environ.items() if k not in leave_out}
    env |= {"PEARL_VAR_DIR": str(tmp_path), "ALLOWED_HOSTS": "pearl.example.com", "PYTHONPATH": str(ROOT)}
    if production:
        env |= {"PEARL_HTTPS": "1"}
    r = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (r.returncode == 0) == ok, r.stdout + r.stderr
    if not ok:
        assert "SESSION_COOKIE_SECURE" in r.stderr + r.stdout  # the check really looks
