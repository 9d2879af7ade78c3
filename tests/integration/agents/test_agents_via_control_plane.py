"""Issue "node agents" end to end, driven only through the control plane: two agents started as
processes register with their own tokens; the control plane binds a trainer on the training node and
a prefill + decode pair on the rollout node; the pair serves a disaggregated request (KV pulled
between processes) whose greedy output equals a colocated run after an in-place role change; the
trainer really trains a GRPO step, its heartbeat publishes weight version 1, and the rollout workers
pull it lazily from the trainer."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agents import dataplane as dp
from agents.worker_client import WorkerClient, generate_disaggregated, session
from tests.integration.agents.test_control_plane_link import wait_for
from tests.support.processes import stop_processes

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.django_db(transaction=True)
SECRET = "dp-secret-e2e"


def start_agent(cp, name: str, pool: str, slots: int, engine: str, tmp_path: Path) -> subprocess.Popen:
    env = dict(os.environ, PEARL_AGENT_TOKEN=cp.agent_token(name), PEARL_DATAPLANE_SECRET=SECRET, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agents.node",
            "--control-plane",
            cp.base_url,
            "--node",
            name,
            "--slots",
            str(slots),
            "--pool",
            pool,
            "--hardware",
            "cpu",
            "--engine",
            engine,
            "--time-factor",
            "0.05",
            "--state-dir",
            str(tmp_path / name),
        ],
        cwd=ROOT,
        env=env,
        stdout=open(tmp_path / f"{name}.log", "wb"),
        stderr=subprocess.STDOUT,
    )


def observed(node_id: int, worker_id: int, **want) -> dict | None:
    from controlplane.models import Node

    n = Node.objects.get(pk=node_id)
    o = {x["worker_id"]: x for x in n.observed}.get(worker_id)
    ok = o and o["state"] == "running" and o["endpoint"] and n.applied_generation == n.generation
    return o if ok and all(o.get(k) == v for k, v in want.items()) else None


async def pd_then_colocated(p_ep: str, d_ep: str) -> tuple[dp.GenerationResult, int]:
    s = session()
    try:
        p, d = WorkerClient(p_ep, SECRET, s), WorkerClient(d_ep, SECRET, s)
        req = dp.GenerateRequest(
            request_id="pd-1",
            prompt="the quick brown fox",
            sampling=dp.SamplingParams(max_tokens=12, stop_at_eos=False),
        )
        out = await generate_disaggregated(p, d, req)
        return out, (await p.stats()).kv_bytes_out
    finally:
        await s.close()


async def colocated(ep: str) -> dp.GenerationResult:
    s = session()
    try:
        return await WorkerClient(ep, SECRET, s).generate(
            dp.GenerateRequest(
                request_id="co-1",
                prompt="the quick brown fox",
                sampling=dp.SamplingParams(max_tokens=12, stop_at_eos=False),
            )
        )
    finally:
        await s.close()


async def train_one_step(trainer_ep: str) -> int:
    from tests.unit.agents.test_trainer import fixed_batch

    s = session()
    try:
        auth = {"Authorization": f"Bearer {SECRET}"}  # the trainer's own secret (the node's data-plane secret)
        async with s.post(
            f"{trainer_ep}/samples",
            json={"samples": [dp.DATA_PLANE.dump(x) for x in fixed_batch(0)], "train": True},
            headers=auth,
        ) as r:
            assert r.status == 200, await r.text()
        async with s.post(f"{trainer_ep}/step", headers=auth) as r:
            return (await r.json())["version"]
    finally:
        await s.close()


# the torch engine's run (a minute of real forward passes) is a long run; the emulated one stays in the default suite
@pytest.mark.parametrize("engine", [pytest.param("torch", marks=pytest.mark.long), "emulated"])
def test_agents_serve_pd_and_colocated_and_pull_trained_weights(control_plane_server, tmp_path, engine):
    from controlplane.models import Job, Node, Worker
    from controlplane.services.workers import WorkerChange, change_workers, start_worker
    from tests.support.cluster import make_job

    cp = control_plane_server
    trainer_agent = start_agent(cp, "train-e2e", "training", 1, "torch", tmp_path)
    rollout_agent = start_agent(cp, "roll-e2e", "reserved", 2, engine, tmp_path)
    try:
        t_node = wait_for(
            lambda: Node.objects.filter(name="train-e2e", last_heartbeat__isnull=False).first(), what="trainer node"
        )
        r_node = wait_for(
            lambda: Node.objects.filter(name="roll-e2e", last_heartbeat__isnull=False).first(), what="rollout node"
        )
        job = make_job("e2e", engine=engine, model="tiny", rollout_gpus=2, training_gpus=1)
        trainer = start_worker(job_id=job.pk, node_id=t_node.pk, gpu_indexes=[0], role="training", activity="inactive")
        pre = start_worker(job_id=job.pk, node_id=r_node.pk, gpu_indexes=[0], role="prefill", activity="inactive")
        dec = start_worker(job_id=job.pk, node_id=r_node.pk, gpu_indexes=[1], role="decode", activity="inactive")
        change_workers(
            job_id=job.pk,
            changes=[WorkerChange(pre.slot, activity="active"), WorkerChange(dec.slot, activity="active")],
        )
        p = wait_for(lambda: observed(r_node.pk, pre.pk, role="prefill"), what="prefill worker")
        d = wait_for(lambda: observed(r_node.pk, dec.pk, role="decode"), what="decode worker")
        pd_out, kv_bytes = asyncio.run(pd_then_colocated(p["endpoint"], d["endpoint"]))
        assert len(pd_out.tokens) == 12 and kv_bytes > 0

        # Switch to colocated through the control plane (drain, re-role, admit): same processes.
        change_workers(
            job_id=job.pk,
            changes=[
                WorkerChange(pre.slot, activity="transitioning"),
                WorkerChange(dec.slot, activity="transitioning"),
            ],
        )
        change_workers(
            job_id=job.pk,
            changes=[
                WorkerChange(pre.slot, role="colocated", activity="active"),
                WorkerChange(dec.slot, role="colocated", activity="active"),
            ],
        )
        c = wait_for(
            lambda: observed(r_node.pk, pre.pk, role="colocated", activity="active"), what="in-place role change"
        )
        assert c["endpoint"] == p["endpoint"]
        co_out = asyncio.run(colocated(c["endpoint"]))
        assert co_out.tokens == pd_out.tokens  # disaggregated greedy output == colocated

        # The trainer really trains; its heartbeat publishes v1; rollout workers pull it from the trainer.
        tr = wait_for(lambda: observed(t_node.pk, trainer.pk), what="trainer")
        assert asyncio.run(train_one_step(tr["endpoint"])) == 1
        wait_for(lambda: Job.objects.get(pk=job.pk).weight_version == 1, what="weights published")
        wait_for(
            lambda: all(Worker.objects.get(pk=w.pk).weight_version == 1 for w in (pre, dec)), what="lazy weight pull"
        )
    finally:
        # printed only when the test fails (pytest captures stdout): the nodes as the control plane holds them
        # before the agents stop (a node taken out of service has its workers stopped without a warning), then
        # the agents' logs and their workers' stderr
        with contextlib.suppress(Exception):
            from controlplane.models import Node

            fields = ("pk", "name", "status", "epoch", "generation", "applied_generation", "lease_expires", "observed")
            for row in Node.objects.values(*fields):
                print("node", row)
        stop_processes([trainer_agent, rollout_agent], grace_s=60)
        logs = [tmp_path / f"{name}.log" for name in ("train-e2e", "roll-e2e")] + sorted(tmp_path.rglob("stderr.log"))
        for log in logs:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-60:])
            print(f"--- {log.relative_to(tmp_path)} (tail) ---\n{tail}")
