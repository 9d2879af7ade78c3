"""What the gateway's tests and benchmarks set up, once (issue 19): an aiohttp app on a loopback port, an engine
worker in process or as `python -m agents.worker`, a GRPO trainer server, and the control plane's part of the
driver link played in process. `benchmarks/bench_gateway*.py` import this module too."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import ClientSession, web

from agents import process

ROOT = Path(__file__).resolve().parent.parent.parent
SECRET = "gateway-test-secret"  # the workers' data-plane secret (and the job's token at the trainer)
TRAINER_TOKEN = "trainer-token"


async def serve_app(app: web.Application) -> tuple[web.AppRunner, str]:
    """`app` on 127.0.0.1, an ephemeral port, as the agents serve theirs; the caller cleans the runner up."""
    runner, port = await process.serve_app(app, "127.0.0.1", 0)
    return runner, f"http://127.0.0.1:{port}"


async def start_worker(engine: str = "torch", **kw: Any) -> tuple[web.AppRunner, str, Any]:
    """An engine worker in this process (torch: the tiny model; emulated: qwen3-8b's profile)."""
    from agents.engines import build_engine

    eng = build_engine(engine, model="tiny" if engine == "torch" else "qwen3-8b", threads=1, **kw)
    return await serve_engine(eng)


async def serve_engine(engine: Any) -> tuple[web.AppRunner, str, Any]:
    """A worker server over an engine built by the caller (a subclass that misbehaves, say)."""
    from agents.worker import WorkerServer

    server = WorkerServer(engine, SECRET)
    runner, url = await serve_app(server.app)
    return runner, url, server


class WorkerProc:
    """`python -m agents.worker` in its own process, as a node agent starts one; `url` once it is ready."""

    def __init__(
        self,
        worker_id: int = 1,
        *,
        engine: str = "emulated",
        time_factor: float = 1.0,
        model: str | None = None,
        threads: int = 1,
    ) -> None:
        model = model or ("tiny" if engine == "torch" else "qwen3-8b")
        cmd = [sys.executable, "-m", "agents.worker", "--engine", engine, "--model", model]
        cmd += ["--worker-id", str(worker_id), "--port", "0"]
        cmd += ["--threads", str(threads)] if engine == "torch" else ["--time-factor", str(time_factor)]
        env = os.environ | {"PEARL_WORKER_SECRET": SECRET, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("PEARL_WORKER_READY "):
                self.port = int(json.loads(line.split(" ", 1)[1])["port"])
                break
        else:
            raise RuntimeError("the worker did not start")
        self.url = f"http://127.0.0.1:{self.port}"

    async def inflight(self, http: ClientSession) -> list[dict[str, Any]]:
        from agents.worker_client import WorkerClient

        return (await WorkerClient(self.url, SECRET, http).inflight()).inflight

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@contextlib.asynccontextmanager
async def trainer_server(batch: int, *, max_staleness: int = 8, store: Any = None) -> AsyncIterator[tuple[str, Any]]:
    """A GRPO trainer server on the tiny model (its URL and the server), in this process."""
    from agents.trainer.grpo import GRPOConfig, GRPOTrainer
    from agents.trainer.server import TrainerServer

    trainer = GRPOTrainer(
        "tiny", GRPOConfig(batch_size=batch, max_staleness=max_staleness), store=store, job="agent-job"
    )
    server = TrainerServer(trainer, TRAINER_TOKEN, job_token=SECRET)
    runner, url = await serve_app(server.app)
    try:
        yield url, server
    finally:
        await runner.cleanup()


class Link:
    """The control plane's part of the driver link, in process: update requests granted (unless `grant` is
    false), Training Begin confirmed once asked for, a published version announced to the driver; with
    `install` = (worker URL, trainer URL), the version is first pulled by that worker from the trainer, as
    the control plane has workers do."""

    def __init__(self, *, grant: bool = True, install: tuple[str, str] | None = None) -> None:
        self.driver: Any = None
        self.sent: list[Any] = []
        self.grant = grant
        self.install = install

    async def send(self, msg: Any) -> None:
        from controlplane.core import driver_link as dl

        self.sent.append(msg)
        if isinstance(msg, dl.UpdateRequest) and self.driver is not None and self.grant:
            asyncio.get_running_loop().call_soon(self.driver.on_update_granted, msg.step)

    async def pump(self, http: ClientSession | None = None) -> None:
        d = self.driver
        if d is None or d.cluster is None:
            return
        if d.waiting_return:
            d.on_cluster(dataclasses.replace(d.cluster, training_active=True))
        if d.waiting_version is not None:
            v = d.waiting_version
            if self.install is not None:
                assert http is not None
                wurl, turl = self.install
                body = {"url": turl, "version": v, "token": TRAINER_TOKEN}
                headers = {"Authorization": f"Bearer {SECRET}"}
                async with http.post(f"{wurl}/weights", json=body, headers=headers) as r:
                    if r.status != 200:
                        return  # the trainer may not serve it yet: asked again on the next pump
            d.on_cluster(dataclasses.replace(d.cluster, weight_version=v))


@dataclasses.dataclass
class AgentRun:
    """What `run_agent_job` leaves for the test to inspect."""

    driver: Any  # agents.driver.RolloutDriver
    runner: Any  # agents.envs.agent.AgentRunner
    trainer: Any  # agents.trainer.server.TrainerServer
    posted: list[Any]  # every sample the driver sent the trainer


async def run_agent_job(
    workers: list[Any],
    spec: dict[str, Any],
    *,
    until: Any,
    act: Any = None,
    batch: int = 4,
    group: int = 2,
    max_staleness: int = 8,
    engine: str = "torch",
    report: bool = False,
    timeout_s: float = 120.0,
    every_s: float = 0.1,
) -> AgentRun:
    """The real rollout driver of one `environment: agent` job over `workers` (driver-link `RoutableWorker`s), a GRPO
    trainer server and the in-process `Link`, run until `until(run)` holds (checked every `every_s`);
    `act(driver, http)`, awaited as often, plays the control plane's part beyond `Link.pump` (a kill, a
    return). `report`: the agent spec comes in the JobView, as from the control plane (the driver configures
    the runner and reports its trajectories); otherwise it is configured here and every record is kept."""
    from agents.driver import RolloutDriver
    from agents.envs import agent as agent_env
    from controlplane.core import driver_link as dl

    runner = agent_env.configure(spec)
    job = dl.JobView(
        name="agent-job",
        environment="agent",
        model="tiny",
        engine=engine,
        batch_size=batch,
        group_size=group,
        max_staleness=max_staleness,
        max_trajectory_tokens=512,
        return_deadline_s=30.0,
        agent=spec if report else {},
    )
    link = Link()
    posted: list[Any] = []
    try:
        async with trainer_server(batch) as (turl, tserver), ClientSession() as http:
            keep = tserver.buffer.add

            def add(step: int, samples: list[Any]) -> None:
                posted.extend(samples)
                keep(step, samples)

            tserver.buffer.add = add
            driver = RolloutDriver(job, link=link, token=SECRET, http=http)
            runner = agent_env.runner()  # the driver's own when the JobView carries the spec
            link.driver = driver
            driver.cluster = dl.ClusterView(
                workers=workers,
                weight_version=0,
                training_active=False,
                borrowed=sum(w.overlap for w in workers),
                trainer=turl,
            )
            run = AgentRun(driver, runner, tserver, posted)
            task = asyncio.create_task(driver.run())
            try:
                for _ in range(int(timeout_s / every_s)):
                    await asyncio.sleep(every_s)
                    if act is not None:
                        await act(driver, http)
                    await link.pump()
                    if until(run):
                        break
                    if task.done():
                        task.result()
                else:
                    raise AssertionError("the job did not get there in time")
            finally:
                driver.stop()
                await task
        return run
    finally:
        await runner.stop()
