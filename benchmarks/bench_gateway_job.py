"""Tokens per second of the same job through the gateway vs through the built-in environment (issue 19).

    .venv/bin/python benchmarks/bench_gateway_job.py [--seconds 60] [--batch 8] [--group 4]
        [--variants builtin,function,command[,function-inline]] [--answer-tokens N] [--repeats R]
        [--pin] [--json out.json]

One run, the variants one after the other on the same engine worker (`python -m agents.worker`, torch
engine, the tiny model, its own process) with a fresh GRPO trainer (in this process) and a fresh rollout
driver each, for `--seconds` of wall clock each:
  * builtin:  `environment: calculator`, PEARL's built-in calculator (token ids in, token ids out);
  * function: `environment: agent` with `agent_function: examples.agents.calculator_agent:run`, the same
              calculator as an openai-SDK agent (AsyncOpenAI) in the agent-function pool's worker process(es)
              (`agent_isolation: process`, the default), through the gateway;
  * function-inline: the same with `agent_isolation: inline`, the function on the driver's event loop;
  * command:  `environment: agent` with `agent_command: [python, examples/agents/calculator_agent.py]`, the
              same agent unmodified as a process per trajectory (what a user brings).
With `--train` the updates run (GRPO on the tiny model, max staleness 1), and on a loaded CPU they set the
pace of all variants alike; without it (the default) updates are never granted and the loop's staleness
bound is lifted, so the figures are the rollout side's alone, where the gateway sits.
Reported per variant: generated tokens/s and finished trajectories/s over the window (startup included),
the worker's own tokens/s and mean running batch (its /stats, sampled), the median step makespan, the time
between a trajectory's turns (the agent's and the gateway's, on the critical path), steps trained, failed
runs, and each agent variant's ratio to builtin. Both calculators sample one token per turn, at most three
turns: the figures are per-turn and per-trajectory overheads, not decode speed.

`--answer-tokens N` (realistic turns): instead of the calculator, three turns of up to N sampled tokens each
(`benchmarks/gateway_agents.py`: the built-in form `Answers` below, the agent as a function and as a process,
each turn ending at EOS or its budget under the same rule). The built-in form's turns are the gateway's chat
template for the tiny model (the same token ids the agent's messages become), and the torch engine's draw
depends only on (trajectory, position), so both forms sample the same tokens: the difference is the path.
`--repeats R` runs the variants R times, interleaved (builtin, function, command, builtin, ...), and reports
each variant's median tokens/s and the median of its per-repeat ratio to builtin. `--pin` puts the worker
alone on the last CPU and this process, the driver, the gateway and every agent process on the others (as
on a GPU host, where the engine's compute is not on the agents' cores); without it the scheduler shares all
CPUs. The process form's rows also give the agents' own CPU per trajectory (their processes', reaped) beside
an interpreter start-up with `openai` imported (measured alone, `startup`): the part of a trajectory that is
the agent's own, not PEARL's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.support.gateway import SECRET, Link, WorkerProc, trainer_server  # noqa: E402 (after the path)

TASKS = str(ROOT / "examples" / "agents" / "tasks.jsonl")
AGENTS = ROOT / "benchmarks" / "gateway_agents.py"


def register_answers() -> None:
    """`environment: bench-answers`, the built-in form of `gateway_agents` (token ids in and out), its turns
    templated with the gateway's chat format for the tiny model, so both forms sample after the same ids."""
    import gateway_agents as ga  # benchmarks/ is on sys.path (this script's directory)

    from agents.envs.base import Environment, Turn, register
    from agents.gateway.chat import load_format

    chat = load_format("tiny")  # the gateway's template: the same token ids as the agent's turns

    class Answers(Environment):
        temperature = 1.0
        stop_at_eos = True  # as an agent's turn: it ends at the model's end of sequence or its budget

        def __init__(self, **_: object) -> None:
            self.turn = 0
            self.n = ga.answer_tokens()

        async def reset(self) -> Turn:
            return Turn(chat.render([{"role": "user", "content": ga.PROMPT}], None), max_tokens=self.n)

        async def step(self, response: list[int]) -> Turn:
            self.turn += 1
            if self.turn < ga.TURNS:
                ids = chat.closing(response) + (chat.delta([{"role": "user", "content": ga.NEXT}], None) or [])
                return Turn(ids, max_tokens=self.n)
            return Turn([], done=True, reward=ga.reward_of(chat.answer(response).content or ""))

    register("bench-answers", lambda **kw: Answers(**kw))


def children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def startup(n: int = 5) -> dict[str, float]:
    """An agent process's fixed cost, alone: a Python start with the openai client made (median of n)."""
    code = "from openai import OpenAI; OpenAI(api_key='x', base_url='http://127.0.0.1:9/v1')"
    walls, cpus = [], []
    for _ in range(n):
        c0, t0 = children_cpu_s(), time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        walls.append(time.perf_counter() - t0)
        cpus.append(children_cpu_s() - c0)
    return {"wall_s": round(statistics.median(walls), 3), "cpu_s": round(statistics.median(cpus), 3)}


async def worker_stats(http: Any, wurl: str) -> dict[str, Any]:
    async with http.get(f"{wurl}/stats", headers={"Authorization": f"Bearer {SECRET}"}) as r:
        return dict(await r.json())


async def run_variant(name: str, wurl: str, args: argparse.Namespace) -> dict[str, Any]:
    from aiohttp import ClientSession

    from agents.driver import RolloutDriver
    from agents.envs import agent as agent_env
    from controlplane.core import driver_link as dl
    from controlplane.core.state import Role

    long = args.answer_tokens > 0
    agent: dict[str, Any] = {}
    if name in ("function", "function-inline"):
        fn = "gateway_agents:run" if long else "examples.agents.calculator_agent:run"
        agent = {"tasks": TASKS, "agent_function": fn}
        if name == "function-inline":
            agent["agent_isolation"] = "inline"
    elif name == "command":
        script = AGENTS if long else ROOT / "examples/agents/calculator_agent.py"
        agent = {"tasks": TASKS, "agent_command": [sys.executable, str(script)]}
    from agents.weights import WeightStore

    store = WeightStore(Path(tempfile.mkdtemp(prefix="bench-weights-")))  # what workers pull versions from
    job = dl.JobView(
        name="bench",
        environment="agent" if agent else ("bench-answers" if long else "calculator"),
        model="tiny",
        engine="torch",
        batch_size=args.batch,
        group_size=args.group,
        max_staleness=1 if args.train else 1000,
        max_trajectory_tokens=4096 if long else 512,
        return_deadline_s=30.0,
        agent=agent,
    )
    cpu0, child0 = time.process_time(), children_cpu_s()
    async with trainer_server(args.batch, max_staleness=1, store=store) as (turl, _), ClientSession() as http:
        link = Link(grant=args.train, install=(wurl, turl))
        driver = RolloutDriver(job, link=link, token=SECRET, http=http)
        link.driver = driver
        driver.cluster = dl.ClusterView(
            workers=[dl.RoutableWorker(1, Role.COLOCATED, wurl)],
            weight_version=0,
            training_active=False,
            borrowed=0,
            trainer=turl,
        )
        s0 = await worker_stats(http, wurl)
        t0 = time.perf_counter()
        task = asyncio.create_task(driver.run())
        per_step: dict[int, int] = {}  # the loop keeps only its last trained steps' records: read them as they go
        batch: list[int] = []  # the worker's running batch, sampled: fewer sequences decoding is what costs
        while time.perf_counter() - t0 < args.seconds:
            await asyncio.sleep(0.05)
            await link.pump(http)
            if len(batch) < 20 * (time.perf_counter() - t0):  # ~20 samples a second
                batch.append(int((await worker_stats(http, wurl))["running_batch"]))
            per_step.update((j, st.generated_tokens) for j, st in driver.loop.steps.items())
            if task.done():
                task.result()
        wall = time.perf_counter() - t0
        s1 = await worker_stats(http, wurl)
        loop = driver.loop
        per_step.update((j, st.generated_tokens) for j, st in loop.steps.items())
        generated = sum(per_step.values())
        finished = loop.finished_trajectories
        driver.stop()
        await task
        if agent:
            await agent_env.runner().stop()
    rewards = [t["reward"] for t in driver.trained]
    done = [t for t in driver.loop.trajs.values() if t.state.name == "DONE"]  # (untrained runs keep them all)
    turns, done_tokens = sum(t.turn for t in done), sum(t.generated for t in done)
    steps = [st for st in driver.loop.steps.values() if st.end_s > 0]
    # where a step's wall time goes: a step ends with its last trajectory (the tail), so per-turn time outside
    # the engine (the agent's, the gateway's) is on the critical path even when it is a small share of CPU
    tail = [max((driver.loop.trajs[t] for t in st.trajectories), key=lambda t: t.end_s) for st in steps]
    return {
        "variant": name,
        "wall_s": round(wall, 1),
        "generated_tokens": generated,
        "tokens_per_s": round(generated / wall, 2),
        "trajectories": finished,
        "trajectories_per_s": round(finished / wall, 2),
        "worker_tokens_per_s": round((s1["generated_tokens"] - s0["generated_tokens"]) / wall, 2),
        "worker_running_batch_mean": round(statistics.fmean(batch), 1) if batch else None,
        "steps_trained": len(driver.trained),
        "failed": loop.failed_trajectories,
        "mean_reward_per_step": [round(r, 3) for r in rewards],
        "driver_process_cpu_s": round(time.process_time() - cpu0, 1),
        "driver_cpu_ms_per_trajectory": round(1000 * (time.process_time() - cpu0) / max(1, finished), 2),
        "tokens_per_turn": round(done_tokens / turns, 1) if turns else None,
        "step_makespan_s_median": round(statistics.median(st.end_s - st.start_s for st in steps), 2) if steps else None,
        # between turns (the environment's or agent's time, the gateway's hops included), per turn
        "between_turns_ms_per_turn": round(1000 * sum(t.env_time_s for t in done) / turns, 1) if turns else None,
        "last_trajectory_gen_env_s_median": [
            round(statistics.median(t.gen_time_s for t in tail), 2),
            round(statistics.median(t.env_time_s for t in tail), 2),
        ]
        if tail
        else None,
        # the agent processes' own CPU (reaped children; the worker is not reaped until the end)
        "agent_cpu_ms_per_trajectory": round(1000 * (children_cpu_s() - child0) / max(1, finished), 1),
    }


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    if args.answer_tokens:
        os.environ["PEARL_BENCH_ANSWER_TOKENS"] = str(args.answer_tokens)  # the agents' processes inherit it
        register_answers()
    names = args.variants.split(",")
    if args.pin:  # the worker alone on the last CPU, this process and every agent it starts on the others
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[-1]})  # the worker inherits it (and its threads theirs)
    worker = WorkerProc(engine="torch")
    if args.pin:
        os.sched_setaffinity(0, set(cpus[:-1]))
    wurl = worker.url
    rows = []
    loads = [os.getloadavg()[0]]
    try:
        if args.repeats > 1:  # the worker's first turns (allocation, caches) are counted by no variant
            await run_variant("builtin", wurl, argparse.Namespace(**{**vars(args), "seconds": min(5.0, args.seconds)}))
        for rep in range(args.repeats):
            for name in names:
                row = await run_variant(name, wurl, args) | {"repeat": rep}
                rows.append(row)
                loads.append(os.getloadavg()[0])
                print(json.dumps(row), flush=True)
    finally:
        worker.stop()
    for rep in range(args.repeats):
        base = next((r for r in rows if r["variant"] == "builtin" and r["repeat"] == rep), None)
        for r in rows:
            if base and r["repeat"] == rep:
                r["tokens_per_s_vs_builtin"] = round(r["tokens_per_s"] / max(base["tokens_per_s"], 1e-9), 3)
    summary = {}
    for name in names:
        mine = [r for r in rows if r["variant"] == name]
        summary[name] = {
            "tokens_per_s_median": round(statistics.median(r["tokens_per_s"] for r in mine), 2),
            "trajectories_per_s_median": round(statistics.median(r["trajectories_per_s"] for r in mine), 3),
            "worker_tokens_per_s_median": round(statistics.median(r["worker_tokens_per_s"] for r in mine), 2),
            "worker_running_batch_mean_median": statistics.median(r["worker_running_batch_mean"] or 0 for r in mine),
            "driver_cpu_ms_per_trajectory_median": statistics.median(r["driver_cpu_ms_per_trajectory"] for r in mine),
            "agent_cpu_ms_per_trajectory_median": statistics.median(r["agent_cpu_ms_per_trajectory"] for r in mine),
        }
        ratios = [r["tokens_per_s_vs_builtin"] for r in mine if "tokens_per_s_vs_builtin" in r]
        if ratios:
            summary[name]["vs_builtin_median"] = round(statistics.median(ratios), 3)
    return {
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "load_average_during": [round(min(loads), 1), round(max(loads), 1)],
        "batch": args.batch,
        "group": args.group,
        "answer_tokens": args.answer_tokens,
        "train": args.train,
        "pinned": args.pin,
        "startup": startup() if "command" in names else None,
        "summary": summary,
        "rows": rows,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--variants", default="builtin,function,command")
    p.add_argument("--train", action="store_true", help="run the updates too (they pace every variant)")
    p.add_argument("--answer-tokens", type=int, default=0, help="realistic turns: up to N tokens each (0: calculator)")
    p.add_argument("--repeats", type=int, default=1, help="run the variants this many times, interleaved")
    p.add_argument(
        "--pin", action="store_true", help="the worker on its own CPU, the driver and the agents on the rest"
    )
    p.add_argument("--json", default="")
    args = p.parse_args()
    out = asyncio.run(bench(args))
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
