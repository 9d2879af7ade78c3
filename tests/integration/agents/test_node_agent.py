"""The node agent supervising real worker processes (emulated engine), over a fake agent link.

The fake link server stands in for the control plane only here; the agent <-> real Daphne control
plane test is test_control_plane_link.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import torch
from aiohttp import web

from agents import dataplane as dp
from agents.node import AgentConfig, NodeAgent
from agents.process import REPO_ROOT
from agents.weights import WeightStore, weight_routes
from agents.worker_client import WorkerClient, generate_disaggregated, session
from controlplane.core import agent_link as link
from controlplane.core.state import Activity, Role
from tests.support.processes import journaled_tokens
from tests.unit.agents.fake_control_plane import FakeControlPlane

SLOW = 0.5  # emulated time factor: slow enough that a long request is still running when we kill it


def worker(wid: int, role: str, activity: str = "active", **kw) -> link.DesiredWorker:
    return link.DesiredWorker(
        worker_id=wid,
        gpus=[wid],
        role=Role(role),
        activity=Activity(activity),
        engine="emulated",
        model="qwen3-8b",
        **kw,
    )


def observed(cp: FakeControlPlane, generation: int) -> dict[int, dict] | None:
    """The workers of the latest heartbeat that reports `generation` for every worker."""
    for hb in reversed(cp.of_type("heartbeat")):
        ws = {w["worker_id"]: w for w in hb["workers"]}
        if hb["generation"] == generation and ws and all(w["generation"] == generation for w in ws.values()):
            return ws
        break
    return None


@contextlib.asynccontextmanager
async def one_worker(cp: FakeControlPlane, tmp_path: Path, node: str, **cfg) -> AsyncIterator[NodeAgent]:
    """An agent of node `node` running one colocated emulated worker (worker 1, running when this yields)."""
    agent = NodeAgent(
        AgentConfig(control_plane=cp.url, token="node-token", node=node, slots=1, state_dir=tmp_path / "agent", **cfg)
    )
    task = asyncio.create_task(agent.run())
    try:
        await cp.wait_for(lambda c: c.of_type("register"))
        await cp.push(link.DesiredState(generation=1, epoch=1, status="ready", workers=[worker(1, "colocated")]))
        ws = await cp.wait_for(lambda c: observed(c, 1))
        assert ws[1]["state"] == "running"
        yield agent
    finally:
        agent.stopping.set()
        await asyncio.wait_for(task, 60)


@pytest.fixture
async def cp():
    server = FakeControlPlane()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def weight_store(tmp_path):
    store = WeightStore(tmp_path / "store")
    app = web.Application()
    app.add_subapp("/weights/", weight_routes(store, lambda token: token == "wtoken"))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield store, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    await runner.cleanup()


async def test_agent_reconciles_restarts_and_drains(cp, weight_store, tmp_path):
    store, store_url = weight_store
    store.publish(1, {"w": torch.zeros(4)})
    agent = NodeAgent(
        AgentConfig(
            control_plane=cp.url,
            token="node-token",
            node="n1",
            slots=4,
            state_dir=tmp_path / "agent",
            time_factor=SLOW,
            drain_timeout_s=2.0,
        )
    )
    task = asyncio.create_task(agent.run())
    s = session()
    try:
        await cp.wait_for(lambda c: c.of_type("register"))
        await cp.push(
            link.DesiredState(
                generation=1,
                epoch=1,
                status="ready",
                workers=[
                    worker(1, "colocated"),
                    worker(2, "prefill"),
                    worker(3, "decode", min_weight_version=1, weights_url=store_url, weights_token="wtoken"),
                ],
            )
        )
        ws = await cp.wait_for(lambda c: observed(c, 1))
        assert {w: (o["role"], o["state"]) for w, o in ws.items()} == {
            1: ("colocated", "running"),
            2: ("prefill", "running"),
            3: ("decode", "running"),
        }
        assert ws[3]["weight_version"] == 1  # pulled lazily because the job requires >= 1
        clients = {w: WorkerClient(o["endpoint"], agent.workers[w].proc.secret, s) for w, o in ws.items()}
        pids = {w: agent.workers[w].proc.pid for w in ws}

        # the workers serve: colocated, and prefill -> KV pull -> decode
        req = dp.GenerateRequest(request_id="a", prompt="hi", sampling=dp.SamplingParams(max_tokens=3, seed=5))
        colo = await clients[1].generate(req)
        pd = await generate_disaggregated(clients[2], clients[3], req)
        assert pd.tokens == colo.tokens and pd.worker_id == 3

        # role change and sleep happen in place (same processes)
        await cp.push(
            link.DesiredState(
                generation=2,
                epoch=1,
                status="ready",
                workers=[
                    worker(1, "colocated", "inactive"),
                    worker(2, "decode"),
                    worker(3, "decode", min_weight_version=1, weights_url=store_url, weights_token="wtoken"),
                ],
            )
        )
        ws = await cp.wait_for(lambda c: observed(c, 2))
        assert ws[2]["role"] == "decode" and ws[1]["activity"] == "inactive"
        assert (await clients[1].get("health"))["state"] == "sleeping"
        assert {w: agent.workers[w].proc.pid for w in ws} == pids

        # telemetry flows: engine records and the agent's toggle record (sleep after a wake)
        await cp.wait_for(
            lambda c: any(r["kind"] == "decode_iteration" for t in c.of_type("telemetry") for r in t["records"])
        )

        # a crash: kill -9 a worker mid-request -> fault with the partial output, then a restart
        await cp.push(
            link.DesiredState(
                generation=3,
                epoch=1,
                status="ready",
                workers=[
                    worker(1, "colocated"),
                    worker(2, "decode"),
                    worker(3, "decode", min_weight_version=1, weights_url=store_url, weights_token="wtoken"),
                ],
            )
        )
        await cp.wait_for(lambda c: observed(c, 3))
        await cp.push(
            link.DesiredState(
                generation=4,
                epoch=1,
                status="ready",
                workers=[
                    worker(1, "colocated", "inactive"),
                    worker(2, "decode"),
                    worker(3, "decode", min_weight_version=1, weights_url=store_url, weights_token="wtoken"),
                ],
            )
        )
        toggle = await cp.wait_for(
            lambda c: [r for t in c.of_type("telemetry") for r in t["records"] if r["kind"] == "toggle"]
        )
        assert toggle[0]["worker"] == 1 and toggle[0]["activation_s"] > 0 and toggle[0]["return_s"] > 0
        # in the job's clock: the emulated sleep waits the profile's deactivation time at SLOW x real time
        from controlplane.core.profiles import get_profile

        assert toggle[0]["return_s"] >= get_profile("h800", "qwen3-8b", tp=1).reconfig.intra_scale_deactivation_s
        await cp.push(
            link.DesiredState(
                generation=5,
                epoch=1,
                status="ready",
                workers=[
                    worker(1, "colocated"),
                    worker(2, "decode"),
                    worker(3, "decode", min_weight_version=1, weights_url=store_url, weights_token="wtoken"),
                ],
            )
        )
        await cp.wait_for(lambda c: observed(c, 5))
        long = asyncio.create_task(
            clients[1].generate(
                dp.GenerateRequest(request_id="long", prompt="x" * 50, sampling=dp.SamplingParams(max_tokens=8000))
            )
        )
        await cp.wait_for(lambda c: journaled_tokens(agent.workers[1].proc.state_dir))
        os.kill(pids[1], signal.SIGKILL)
        with pytest.raises(aiohttp.ClientError):
            await long  # the caller sees the connection drop ...
        crash = await cp.wait_for(lambda c: [f for f in c.of_type("fault") if f["kind"] == "crashed"])
        aborted = crash[0]["aborted"]  # ... and the agent reports what was generated so far
        assert crash[0]["worker_id"] == 1 and aborted[0]["request_id"] == "long" and len(aborted[0]["tokens"]) >= 1
        assert aborted[0]["finish_reason"] == "abort"
        await cp.wait_for(lambda c: [f for f in c.of_type("fault") if f["kind"] == "restarted"])
        new = agent.workers[1].proc
        assert new.pid != pids[1]
        again = await WorkerClient(new.endpoint, new.secret, s).generate(req)
        assert again.tokens == colo.tokens

        # a worker that is no longer desired is drained and stopped
        await cp.push(
            link.DesiredState(
                generation=6, epoch=1, status="ready", workers=[worker(1, "colocated"), worker(2, "decode")]
            )
        )
        ws = await cp.wait_for(lambda c: observed(c, 6))
        assert set(ws) == {1, 2}
        assert agent.workers.get(3) is None

        # a preemption notice: every worker drains and stops before the deadline
        busy = asyncio.create_task(
            WorkerClient(new.endpoint, new.secret, s).generate(
                dp.GenerateRequest(request_id="busy", prompt="y", sampling=dp.SamplingParams(max_tokens=8000))
            )
        )
        await asyncio.sleep(0.5)
        await cp.push(
            link.DesiredState(
                generation=7, epoch=1, status="draining", workers=[], preemption_deadline=__import__("time").time() + 3
            )
        )
        result = await busy
        assert result.finish_reason == "abort" and result.tokens  # the partial output comes back to the caller
        ws = await cp.wait_for(
            lambda c: (
                (hb := c.of_type("heartbeat")[-1])
                and all(w["state"] == "stopped" for w in hb["workers"])
                and hb["workers"]
            )
        )
        drained = [f for f in cp.of_type("fault") if f["kind"] == "drained"]
        assert any(a["request_id"] == "busy" for f in drained for a in f["aborted"])
    finally:
        await s.close()
        agent.stopping.set()
        await asyncio.wait_for(task, 60)


async def test_sigterm_drains_workers_and_reports(cp, tmp_path):
    env = dict(
        os.environ, PEARL_AGENT_TOKEN="node-token", PEARL_DATAPLANE_SECRET="dp-secret", PYTHONPATH=str(REPO_ROOT)
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agents.node",
        "--control-plane",
        cp.url,
        "--node",
        "n2",
        "--slots",
        "1",
        "--engine",
        "emulated",
        "--time-factor",
        str(SLOW),
        "--state-dir",
        str(tmp_path / "agent"),
        "--drain-timeout",
        "1",
        cwd=str(REPO_ROOT),
        env=env,
    )
    s = session()
    try:
        await cp.wait_for(lambda c: c.of_type("register"))
        assert "node-token" not in " ".join(Path(f"/proc/{proc.pid}/cmdline").read_text().split("\0"))
        await cp.push(link.DesiredState(generation=1, epoch=1, status="ready", workers=[worker(1, "colocated")]))
        ws = await cp.wait_for(lambda c: observed(c, 1))
        client = WorkerClient(ws[1]["endpoint"], "dp-secret", s)
        pid = (await client.get("health"))["pid"]
        busy = asyncio.create_task(
            client.generate(dp.GenerateRequest(request_id="b", prompt="z", sampling=dp.SamplingParams(max_tokens=8000)))
        )
        await asyncio.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        result = await busy
        assert result.finish_reason == "abort" and result.tokens
        assert await asyncio.wait_for(proc.wait(), 60) == 0
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        last = cp.of_type("heartbeat")[-1]
        assert [w["state"] for w in last["workers"]] == ["stopped"]
        assert any(a["request_id"] == "b" for f in cp.of_type("fault") if f["kind"] == "drained" for a in f["aborted"])
    finally:
        await s.close()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_standalone_mode_serves_without_a_control_plane(tmp_path):
    import json

    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    env.pop("PEARL_AGENT_TOKEN", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agents.node",
        "--slots",
        "2",
        "--engine",
        "emulated",
        "--model",
        "qwen3-8b",
        "--time-factor",
        "0.01",
        "--state-dir",
        str(tmp_path / "agent"),
        cwd=str(REPO_ROOT),
        env=env,
        stdout=asyncio.subprocess.PIPE,
    )
    s = session()
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode()
        assert line.startswith("PEARL_AGENT_READY ")
        info = json.loads(line.split(" ", 1)[1])
        listing = json.loads(Path(info["secrets_file"]).read_text())
        assert oct(os.stat(info["secrets_file"]).st_mode & 0o777) == "0o600" and len(listing) == 2
        served = [WorkerClient(w["endpoint"], w["secret"], s) for w in listing]
        outs = [
            await served[i].generate(
                dp.GenerateRequest(request_id=f"s{i}", prompt="q", sampling=dp.SamplingParams(max_tokens=5))
            )
            for i in range(2)
        ]
        assert {o.worker_id for o in outs} == {1, 2} and all(len(o.tokens) == 5 for o in outs)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    finally:
        await s.close()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await proc.stdout.read()  # to EOF, so the pipe transport closes


async def test_training_worker_serves_weights_that_rollout_workers_pull(cp, tmp_path):
    """Role training runs the GRPO trainer process; its snapshots are what rollout workers pull, with a
    scoped token of the trainer's job (the agent holds no weights secret of its own)."""
    import secrets as _secrets

    key = _secrets.token_hex(32)
    agent = NodeAgent(
        AgentConfig(
            control_plane=cp.url,
            token="node-token",
            node="n3",
            slots=2,
            state_dir=tmp_path / "agent",
            time_factor=0.01,
            hardware="cpu",
        )
    )
    task = asyncio.create_task(agent.run())
    s = session()
    try:
        await cp.wait_for(lambda c: c.of_type("register"))
        trainer = link.DesiredWorker(
            worker_id=10,
            gpus=[0],
            role=Role.TRAINING,
            activity=Activity.ACTIVE,
            engine="torch",
            model="tiny",
            job="j",
            weights_key=key,
        )
        await cp.push(link.DesiredState(generation=1, epoch=1, status="ready", workers=[trainer]))
        ws = await cp.wait_for(lambda c: observed(c, 1))
        assert ws[10]["role"] == "training" and ws[10]["state"] == "running" and ws[10]["devices"] == [0]
        turl = ws[10]["endpoint"]
        secret = agent.workers[10].proc.secret  # the trainer's own secret: its agent (and the job's driver) hold it
        # train one step through the trainer's data plane -> weight version 1
        from tests.unit.agents.test_trainer import fixed_batch

        async with s.post(
            f"{turl}/samples",
            json={"samples": [dp.DATA_PLANE.dump(x) for x in fixed_batch(0)], "train": True},
            headers={"Authorization": f"Bearer {secret}"},
        ) as r:
            assert r.status == 200
        agent.heartbeat_s = 3600.0  # from now on only an event makes the agent report
        await asyncio.sleep(0.5)  # past the heartbeat loop's current wait
        async with s.post(f"{turl}/step", headers={"Authorization": f"Bearer {secret}"}) as r:
            assert (await r.json())["version"] == 1
        # the new version is reported when the trainer publishes it, not at the next periodic heartbeat
        await cp.wait_for(
            lambda c: any(
                w["worker_id"] == 10 and w["weight_version"] == 1
                for hb in c.of_type("heartbeat")
                for w in hb["workers"]
            )
        )
        agent.heartbeat_s = cp.heartbeat_s
        rotate = agent.weights_rotate_s
        now = link.token_bucket(rotate)
        for bad in (
            "",
            "pwt_1.00",
            link.weights_token(key, "other-job", now),
            link.weights_token(key, "j", now - 5),
            link.weights_token(_secrets.token_hex(32), "j", now),
        ):
            async with s.get(f"{turl}/weights/latest", headers={"Authorization": f"Bearer {bad}"}) as r:
                assert r.status == 401, bad  # another job's, an expired or a forged token opens nothing
        rollout = link.DesiredWorker(
            worker_id=11,
            gpus=[1],
            role=Role.COLOCATED,
            activity=Activity.ACTIVE,
            engine="emulated",
            model="tiny",
            job="j",
            min_weight_version=1,
            weights_url=turl,
            weights_token=link.weights_token(key, "j", now),
        )
        await cp.push(link.DesiredState(generation=2, epoch=1, status="ready", workers=[trainer, rollout]))
        ws = await cp.wait_for(lambda c: observed(c, 2))
        assert ws[11]["weight_version"] == 1 and ws[11]["state"] == "running" and ws[11]["devices"] == [1]
    finally:
        await s.close()
        agent.stopping.set()
        await asyncio.wait_for(task, 60)


async def test_a_worker_drained_by_a_notice_that_is_taken_back_starts_again(cp, tmp_path):
    """A preemption notice drains the node's workers; the notice is cancelled (the node returns to service)
    while the control plane still wants the worker: it runs again, a new process on its slot, instead of
    staying stopped while a transition waits for it."""
    async with one_worker(cp, tmp_path, "n4", time_factor=SLOW, drain_timeout_s=1.0) as agent:
        first = agent.workers[1].proc.pid
        await cp.push(
            link.DesiredState(
                generation=2,
                epoch=1,
                status="draining",
                preemption_deadline=time.time() + 30,
                workers=[worker(1, "colocated", "transitioning")],
            )
        )
        await cp.wait_for(lambda c: (o := observed(c, 2)) and o[1]["state"] == "stopped")
        await cp.push(link.DesiredState(generation=3, epoch=1, status="ready", workers=[worker(1, "colocated")]))
        await cp.wait_for(lambda c: (o := observed(c, 3)) and o[1]["state"] == "running" and o)
        assert agent.workers[1].proc.pid != first


async def test_a_start_the_desired_state_no_longer_wants_is_given_up_at_once(cp, tmp_path):
    """A worker still starting (here its first weights never come) that a new desired state no longer wants (a
    lent training GPU its owner's Training Begin took back: `workers.return_borrowed` stops it) is given up at
    once, its process killed, instead of holding the reconcile pass, and with it every later change, until the
    start ends; the agent reports it stopped, then no more."""
    asked, release = asyncio.Event(), asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        asked.set()
        await release.wait()
        return web.Response(status=503)

    app = web.Application()
    app.router.add_get("/{tail:.*}", hang)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/weights/"
    try:
        async with one_worker(cp, tmp_path, "n7", time_factor=SLOW) as agent:
            starting = worker(2, "colocated", weights_url=url, weights_token="t", min_weight_version=1)
            await cp.push(
                link.DesiredState(generation=2, epoch=1, status="ready", workers=[worker(1, "colocated"), starting])
            )
            await asyncio.wait_for(asked.wait(), 60)  # its process serves and its first weight pull is out
            proc = agent.workers[2].proc
            assert proc is not None and agent.workers[2].state == "starting"
            await cp.push(link.DesiredState(generation=3, epoch=1, status="ready", workers=[worker(1, "colocated")]))
            ws = await cp.wait_for(lambda c: (o := observed(c, 3)) and 2 not in o and o, timeout=30)
            assert ws[1]["state"] == "running"
            assert proc.proc.returncode is not None  # killed, not left behind
            reports = [w for hb in cp.of_type("heartbeat") for w in hb["workers"] if w["worker_id"] == 2]
            assert reports and all(w["state"] in ("starting", "stopped") for w in reports), reports
            assert not [f for f in cp.of_type("fault") if f.get("worker_id") == 2]  # given up, not crashed
    finally:
        release.set()
        await runner.cleanup()


async def test_a_start_given_up_before_its_worker_serves_leaves_no_process(cp, tmp_path):
    """The same, given up while the worker process is still coming up (here SIGSTOPped before it says it serves,
    as a vLLM engine loading its model takes long): the agent kills it and reaps it, drops its lease, and only
    then reports it gone."""
    import json

    async with one_worker(cp, tmp_path, "n8", time_factor=SLOW) as agent:
        await cp.push(
            link.DesiredState(
                generation=2, epoch=1, status="ready", workers=[worker(1, "colocated"), worker(2, "colocated")]
            )
        )
        lease = tmp_path / "agent" / "jobs" / "-" / "worker-2" / "process.json"
        pid = 0
        for _ in range(6000):  # the lease is written as the process starts, before it serves
            with contextlib.suppress(OSError, ValueError):
                pid = int(json.loads(lease.read_text())["pid"])
                break
            await asyncio.sleep(0.01)
        os.kill(pid, signal.SIGSTOP)  # it never says it serves
        assert agent.workers[2].state == "starting" and agent.workers[2].proc is None
        await cp.push(link.DesiredState(generation=3, epoch=1, status="ready", workers=[worker(1, "colocated")]))
        await cp.wait_for(lambda c: (o := observed(c, 3)) and 2 not in o and o, timeout=30)
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # killed and reaped
        assert not lease.exists()


async def test_a_preempted_worker_that_hangs_is_killed_before_the_deadline(cp, tmp_path):
    """A worker that neither answers the drain nor exits on SIGTERM (here SIGSTOPped: a loaded machine's
    vLLM worker can be as slow) is SIGKILLed by the agent before its node's preemption deadline, instead of
    being waited for the drain's answer and then the 15 s SIGTERM grace."""
    async with one_worker(cp, tmp_path, "n5", time_factor=SLOW, drain_timeout_s=10.0) as agent:
        proc = agent.workers[1].proc
        os.kill(proc.pid, signal.SIGSTOP)
        deadline = time.time() + 8
        await cp.push(
            link.DesiredState(generation=2, epoch=1, status="draining", preemption_deadline=deadline, workers=[])
        )
        rc = await asyncio.wait_for(proc.proc.wait(), 60)
        assert time.time() < deadline, "the worker outlived its node's preemption deadline"
        assert rc == -signal.SIGKILL


async def test_an_agent_runs_its_emulated_engines_with_the_interference_it_was_given(cp, tmp_path):
    """`agents.node --interference 2`: the agent passes it to its emulated workers, whose prefill next to
    running decodes then costs twice its roofline time, as their PREFILL records show the control plane."""
    from controlplane.core.profiles import get_profile

    agent = NodeAgent(
        AgentConfig(
            control_plane=cp.url,
            token="node-token",
            node="n-int",
            slots=1,
            state_dir=tmp_path / "agent",
            time_factor=0.02,
            interference=2.0,
        )
    )
    task = asyncio.create_task(agent.run())
    s = session()
    try:
        await cp.wait_for(lambda c: c.of_type("register"))
        await cp.push(link.DesiredState(generation=1, epoch=1, status="ready", workers=[worker(1, "colocated")]))
        ws = await cp.wait_for(lambda c: observed(c, 1))
        client = WorkerClient(ws[1]["endpoint"], agent.workers[1].proc.secret, s)

        def gen(rid: str, n: int, prompt: str, stop_at_eos: bool = True) -> dp.GenerateRequest:
            return dp.GenerateRequest(
                request_id=rid, prompt=prompt, sampling=dp.SamplingParams(max_tokens=n, seed=1, stop_at_eos=stop_at_eos)
            )

        # as long a turn as a worker takes (a few seconds at this time factor): still decoding when they come
        long = asyncio.create_task(client.generate(gen("long", dp.MAX_NEW_TOKENS, "x " * 200, stop_at_eos=False)))
        # until it decodes (not a fixed sleep: on a busy machine it may not have started). Its decode is one
        # segment that ends with it, so the decode-iteration count stays 0 while it runs: its prefill is the sign
        for _ in range(1000):
            st = await client.stats()
            if st.running_batch >= 1 and st.prefill_tokens > 0:
                break
            await asyncio.sleep(0.01)
        assert not long.done(), "the long turn ended before the short ones came: nothing for them to ride with"
        await asyncio.gather(*[client.generate(gen(f"s{i}", 2, f"prompt {i} " * (50 + 10 * i))) for i in range(4)])
        await long
        prof = get_profile("H800", "qwen3-8b", 1)  # one slot: the worker's TP is 1
        mixed = await cp.wait_for(
            lambda c: [
                r
                for t in c.of_type("telemetry")
                for r in t["records"]
                if r["kind"] == "prefill" and r.get("running_batch", 0) > 0
            ]
        )
        for r in mixed:
            assert r["duration_s"] == pytest.approx(
                2.0 * prof.prefill_s(r["tokens"], r.get("prefix_tokens", 0)), rel=1e-6
            )
    finally:
        await s.close()
        agent.stopping.set()
        await asyncio.wait_for(task, 60)


async def test_a_worker_that_stops_answering_does_not_stop_the_heartbeats(cp, tmp_path):
    """The heartbeat is the node's lease: a worker that does not answer its stats and telemetry questions
    (SIGSTOPped here; a vLLM worker changing roles on a starved CPU can be as slow) must not hold it back,
    or the control plane fences the whole node. Its question stays out (not asked again), its last observed
    state goes with the beats, and when it answers again its report moves on."""
    async with one_worker(cp, tmp_path, "n6") as agent:
        proc = agent.workers[1].proc
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            before = len(cp.of_type("heartbeat"))
            # 20 periods of 0.1 s: the old loop sent none, waiting on the stopped worker's answer
            await asyncio.sleep(20 * cp.heartbeat_s)
            beats = cp.of_type("heartbeat")[before:]
            assert len(beats) >= 5, f"{len(beats)} heartbeats while a worker was stopped"
            assert [w["state"] for w in beats[-1]["workers"]] == ["running"]
            assert len([k for k in agent._asking if k[1] == 1]) <= 2  # stats and telemetry, asked once each
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        # answered again: the agent asks anew
        await cp.wait_for(lambda c: not agent._asking)
