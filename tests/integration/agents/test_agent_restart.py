"""A restarted agent kills or reaps what its previous incarnation left running and reports the partial
outputs those workers journaled; a killed agent's workers do not outlive it (parent-death signal)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from agents import dataplane as dp
from agents.process import REPO_ROOT, kill_leftovers, spawn_worker, start_time
from agents.worker_client import WorkerClient, session
from controlplane.core import agent_link as link
from controlplane.core.state import Activity, Role
from tests.integration.agents.test_node_agent import cp, observed  # noqa: F401  (the fake link server fixture)
from tests.support.processes import journaled_tokens


def desired(generation: int) -> link.DesiredState:
    w = link.DesiredWorker(
        worker_id=1,
        gpus=[1],
        role=Role.COLOCATED,
        activity=Activity.ACTIVE,
        engine="emulated",
        model="qwen3-8b",
        job="j",
    )
    return link.DesiredState(generation=generation, epoch=1, status="ready", workers=[w])


async def start_agent(cp, state_dir: Path) -> asyncio.subprocess.Process:  # noqa: F811  (the `cp` fixture imported above)
    env = dict(os.environ, PEARL_AGENT_TOKEN="node-token", PEARL_DATAPLANE_SECRET="dp", PYTHONPATH=str(REPO_ROOT))
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agents.node",
        "--control-plane",
        cp.url,
        "--node",
        "n1",
        "--slots",
        "2",
        "--engine",
        "emulated",
        "--time-factor",
        "0.5",
        "--state-dir",
        str(state_dir),
        cwd=str(REPO_ROOT),
        env=env,
    )


def alive(pid: int) -> bool:
    return start_time(pid) is not None


async def test_killed_agent_takes_its_workers_along_and_the_next_one_reports_their_partials(cp, tmp_path):  # noqa: F811  (the `cp` fixture imported above)
    agent = await start_agent(cp, tmp_path / "agent")
    s = session()
    try:
        await cp.wait_for(lambda c: c.of_type("register"))
        await cp.push(desired(1))
        ws = await cp.wait_for(lambda c: observed(c, 1))
        assert ws[1]["devices"] == [1]  # pinned to its slot's device
        client = WorkerClient(ws[1]["endpoint"], "dp", s)
        pid = (await client.get("health"))["pid"]
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert b"CUDA_VISIBLE_DEVICES=1" in env and b"PEARL_AGENT_TOKEN" not in b" ".join(env)
        busy = asyncio.create_task(
            client.generate(
                dp.GenerateRequest(request_id="left", prompt="x" * 20, sampling=dp.SamplingParams(max_tokens=8000))
            )
        )
        await cp.wait_for(lambda c: journaled_tokens(tmp_path / "agent" / "jobs" / "j" / "worker-1"))
        agent.send_signal(signal.SIGKILL)
        await agent.wait()
        partial = await busy  # the orphan aborts at once; its caller still gets the partial output
        assert partial.finish_reason == "abort" and partial.tokens
        await cp.wait_for(lambda c: not alive(pid))

        cp.received.clear()
        agent = await start_agent(cp, tmp_path / "agent")  # a new incarnation in the same state directory
        fault = await cp.wait_for(lambda c: [f for f in c.of_type("fault") if f["kind"].startswith("orphan")])
        (report,) = fault
        assert report["worker_id"] == 1 and report["kind"] == "orphan_gone"
        assert report["aborted"][0]["request_id"] == "left" and report["aborted"][0]["tokens"] == partial.tokens
        ws = await cp.wait_for(lambda c: observed(c, 1))  # and the desired worker runs again
        assert (await WorkerClient(ws[1]["endpoint"], "dp", s).get("health"))["pid"] != pid
    finally:
        await s.close()
        if agent.returncode is None:
            agent.send_signal(signal.SIGTERM)
            await asyncio.wait_for(agent.wait(), 60)


async def test_kill_leftovers_kills_a_live_group_and_spares_a_reused_pid(tmp_path):
    w = await spawn_worker(
        worker_id=3, engine="emulated", role="colocated", state_dir=tmp_path / "w3", secret="s", time_factor=0.01
    )
    lease = tmp_path / "w3" / "process.json"
    assert lease.exists()
    found = await asyncio.to_thread(kill_leftovers, tmp_path)
    assert [(x["worker_id"], x["was_running"]) for x in found] == [(3, True)]
    await w.proc.wait()
    assert not alive(w.pid) and not lease.exists()
    # a lease whose pid now belongs to another process (different start time) is never killed
    lease.write_text(f'{{"pid": {os.getpid()}, "pgid": {os.getpgid(0)}, "start_time": 1, "worker_id": 4}}')
    found = await asyncio.to_thread(kill_leftovers, tmp_path)
    assert found[0]["was_running"] is False and alive(os.getpid())
    await w.reap()
