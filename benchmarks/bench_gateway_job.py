"""Tokens per second of the same job through the gateway vs through the built-in environment (issue 19).

    .venv/bin/python benchmarks/bench_gateway_job.py [--seconds 60] [--batch 8] [--group 4]
        [--variants builtin,function,command] [--json out.json]

One run, the variants one after the other on the same engine worker (`python -m agents.worker`, torch
engine, the tiny model, its own process) with a fresh GRPO trainer (in this process) and a fresh rollout
driver each, for `--seconds` of wall clock each:
  * builtin:  `environment: calculator`, PEARL's built-in calculator (token ids in, token ids out);
  * function: `environment: agent` with `agent_function: examples.agents.calculator_agent:run`, the same
              calculator as an openai-SDK agent (AsyncOpenAI) in the driver's process, through the gateway;
  * command:  `environment: agent` with `agent_command: [python, examples/agents/calculator_agent.py]`, the
              same agent unmodified as a process per trajectory (what a user brings).
With `--train` the updates run (GRPO on the tiny model, max staleness 1), and on a loaded CPU they set the
pace of all variants alike; without it (the default) updates are never granted and the loop's staleness
bound is lifted, so the figures are the rollout side's alone, where the gateway sits.
Reported per variant: generated tokens/s and finished trajectories/s over the window (startup included),
steps trained, failed runs, and each agent variant's ratio to builtin. Both calculators sample one token
per turn, at most three turns: the figures are per-turn and per-trajectory overheads, not decode speed.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SECRET = "bench-secret"
TASKS = str(ROOT / "examples" / "agents" / "tasks.jsonl")


class Link:
    """The control plane's part of the driver link, in process: updates granted at once (if `train`),
    Training Begin confirmed at once, weights published as soon as the trainer has them."""

    def __init__(self, train: bool) -> None:
        self.driver: Any = None
        self.train = train

    async def send(self, msg: Any) -> None:
        from controlplane.core import driver_link as dl

        if isinstance(msg, dl.UpdateRequest) and self.driver is not None and self.train:
            asyncio.get_running_loop().call_soon(self.driver.on_update_granted, msg.step)

    async def pump(self, http: Any, wurl: str, turl: str) -> None:
        """Training Begin confirmed at once; a published version is installed on the worker (pulled from
        the trainer, as the control plane has workers do) before the driver is told of it."""
        d = self.driver
        if d is None or d.cluster is None:
            return
        if d.waiting_return:
            d.on_cluster(dataclasses.replace(d.cluster, training_active=True))
        if d.waiting_version is not None:
            v = d.waiting_version
            body = {"url": turl, "version": v, "token": "trainer-token"}
            async with http.post(f"{wurl}/weights", json=body, headers={"Authorization": f"Bearer {SECRET}"}) as r:
                if r.status != 200:
                    return  # the trainer may not serve it yet: asked again on the next pump
            d.on_cluster(dataclasses.replace(d.cluster, weight_version=v))


def start_worker() -> tuple[subprocess.Popen[str], str]:
    env = dict(os.environ, PEARL_WORKER_SECRET=SECRET, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "agents.worker", "--engine", "torch", "--model", "tiny", "--threads", "1"]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("PEARL_WORKER_READY "):
            return proc, f"http://127.0.0.1:{json.loads(line.split(' ', 1)[1])['port']}"
    raise RuntimeError("the worker did not start")


async def run_variant(name: str, wurl: str, args: argparse.Namespace) -> dict[str, Any]:
    from aiohttp import ClientSession, web

    from agents.driver import RolloutDriver
    from agents.envs import agent as agent_env
    from agents.trainer.grpo import GRPOConfig, GRPOTrainer
    from agents.trainer.server import TrainerServer
    from controlplane.core import driver_link as dl
    from controlplane.core.state import Role

    agent: dict[str, Any] = {}
    if name == "function":
        agent = {"tasks": TASKS, "agent_function": "examples.agents.calculator_agent:run"}
    elif name == "command":
        agent = {"tasks": TASKS, "agent_command": [sys.executable, str(ROOT / "examples/agents/calculator_agent.py")]}
    from agents.weights import WeightStore

    store = WeightStore(Path(tempfile.mkdtemp(prefix="bench-weights-")))  # what workers pull versions from
    trainer = GRPOTrainer("tiny", GRPOConfig(batch_size=args.batch, max_staleness=1), store=store, job="bench")
    tserver = TrainerServer(trainer, "trainer-token", job_token=SECRET)
    trunner = web.AppRunner(tserver.app, access_log=None)
    await trunner.setup()
    await web.TCPSite(trunner, "127.0.0.1", 0).start()
    turl = f"http://127.0.0.1:{trunner.addresses[0][1]}"
    job = dl.JobView(
        name="bench",
        environment="agent" if agent else "calculator",
        model="tiny",
        engine="torch",
        batch_size=args.batch,
        group_size=args.group,
        max_staleness=1 if args.train else 1000,
        max_trajectory_tokens=512,
        return_deadline_s=30.0,
        agent=agent,
    )
    link = Link(args.train)
    cpu0 = time.process_time()
    try:
        async with ClientSession() as http:
            driver = RolloutDriver(job, link=link, token=SECRET, http=http)
            link.driver = driver
            driver.cluster = dl.ClusterView(
                workers=[dl.WorkerView(1, Role.COLOCATED, wurl)],
                weight_version=0,
                training_active=False,
                borrowed=0,
                trainer=turl,
            )
            t0 = time.perf_counter()
            task = asyncio.create_task(driver.run())
            while time.perf_counter() - t0 < args.seconds:
                await asyncio.sleep(0.05)
                await link.pump(http, wurl, turl)
                if task.done():
                    task.result()
            wall = time.perf_counter() - t0
            loop = driver.loop
            generated = sum(st.generated_tokens for st in loop.steps.values())
            finished = loop.finished_trajectories
            driver.stop()
            await task
            if agent:
                await agent_env.runner().stop()
    finally:
        await trunner.cleanup()
    rewards = [t["reward"] for t in driver.trained]
    return {
        "variant": name,
        "wall_s": round(wall, 1),
        "generated_tokens": generated,
        "tokens_per_s": round(generated / wall, 2),
        "trajectories": finished,
        "trajectories_per_s": round(finished / wall, 2),
        "steps_trained": len(driver.trained),
        "failed": loop.failed_trajectories,
        "mean_reward_per_step": [round(r, 3) for r in rewards],
        "driver_process_cpu_s": round(time.process_time() - cpu0, 1),
    }


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    worker, wurl = start_worker()
    rows = []
    try:
        for name in args.variants.split(","):
            row = await run_variant(name, wurl, args)
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    base = next((r for r in rows if r["variant"] == "builtin"), None)
    if base:
        for r in rows:
            r["tokens_per_s_vs_builtin"] = round(r["tokens_per_s"] / max(base["tokens_per_s"], 1e-9), 3)
    return {
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "load_average": os.getloadavg(),
        "batch": args.batch,
        "group": args.group,
        "train": args.train,
        "rows": rows,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--variants", default="builtin,function,command")
    p.add_argument("--train", action="store_true", help="run the updates too (they pace every variant)")
    p.add_argument("--json", default="")
    args = p.parse_args()
    out = asyncio.run(bench(args))
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
