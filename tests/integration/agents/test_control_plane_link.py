"""The node agent against the real control plane: Daphne's /ws/agent/ consumer on the test database.

The agent process registers with its node token, receives the desired state, starts the worker the
control plane binds to its GPU slot, reports it through heartbeats, changes its role in place when
the desired state changes, and drains on SIGTERM.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents import dataplane as dp
from agents.worker_client import WorkerClient, session

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.django_db(transaction=True)


def wait_for(predicate, timeout: float = 90.0, what: str = ""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


async def _generate(endpoint: str, secret: str) -> dp.GenerationResult:
    s = session()
    try:
        return await WorkerClient(endpoint, secret, s).generate(
            dp.GenerateRequest(request_id="it", prompt="hi", sampling=dp.SamplingParams(max_tokens=4, seed=1))
        )
    finally:
        await s.close()


async def _health(endpoint: str, secret: str) -> dict:
    s = session()
    try:
        return await WorkerClient(endpoint, secret, s).get("health")
    finally:
        await s.close()


def test_agent_registers_starts_worker_and_follows_desired_state(control_plane_server, tmp_path):
    from controlplane.models import GPU, Node, Worker
    from controlplane.services.workers import WorkerChange, change_workers, start_worker
    from tests.support.cluster import make_job

    cp = control_plane_server
    name = "agent-it-1"
    token = cp.agent_token(name)
    env = dict(os.environ, PEARL_AGENT_TOKEN=token, PEARL_DATAPLANE_SECRET="dp-secret", PYTHONPATH=str(ROOT))
    with open(tmp_path / "agent.log", "wb") as log:
        agent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agents.node",
                "--control-plane",
                cp.base_url,
                "--node",
                name,
                "--slots",
                "2",
                "--pool",
                "reserved",
                "--hardware",
                "cpu",
                "--engine",
                "emulated",
                "--time-factor",
                "0.1",
                "--state-dir",
                str(tmp_path / "agent"),
                "-v",
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        node = wait_for(
            lambda: Node.objects.filter(name=name, last_heartbeat__isnull=False).first(),
            what="registration + heartbeat",
        )
        assert node.pool == "reserved" and GPU.objects.filter(node=node).count() == 2
        first_beat = node.last_heartbeat

        job = make_job("agent-link-job", engine="emulated", model="tiny")
        w = start_worker(job_id=job.pk, node_id=node.pk, gpu_indexes=[0], role="colocated", activity="active")

        def running():
            n = Node.objects.get(pk=node.pk)
            obs = {o["worker_id"]: o for o in n.observed}
            o = obs.get(w.pk)
            return (
                o if o and o["state"] == "running" and o["endpoint"] and n.applied_generation == n.generation else None
            )

        o = wait_for(running, what="the worker to run")
        assert o["role"] == "colocated"
        assert Worker.objects.get(pk=w.pk).endpoint == o["endpoint"]
        out = asyncio.run(_generate(o["endpoint"], "dp-secret"))  # the worker really serves
        assert len(out.tokens) == 4 and out.finish_reason == "length"
        pid = asyncio.run(_health(o["endpoint"], "dp-secret"))["pid"]

        # the control plane changes the role (and parks it): the same process follows, in place
        change_workers(job_id=job.pk, changes=[WorkerChange(slot=w.slot, role="prefill", activity="inactive")])
        wait_for(
            lambda: (o2 := running()) and o2["role"] == "prefill" and o2["activity"] == "inactive", what="role change"
        )
        h = asyncio.run(_health(o["endpoint"], "dp-secret"))
        assert h["pid"] == pid and h["role"] == "prefill" and h["state"] == "sleeping"
        assert Node.objects.get(pk=node.pk).last_heartbeat > first_beat

        agent.send_signal(signal.SIGTERM)  # graceful: workers drained and stopped, then exit 0
        assert agent.wait(timeout=60) == 0
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
