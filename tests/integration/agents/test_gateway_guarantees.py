"""PEARL's guarantees hold for an external agent (issue 19 §5), with the official `openai` SDK as the agent's
client, inside the real rollout driver (`environment: agent`):

* an engine worker process SIGKILLed while it decodes the agent's turn: the agent still gets exactly one
  complete answer (the driver routes the turn to another worker; no error reaches the agent);
* a borrowed worker returned at Training Begin while it decodes the agent's turn (the control plane drains
  it, abort mode, and takes it out of the serving set): the turn resumes from its partial prefix on a
  dedicated worker; the agent sees a slower answer, never an error;
* the staleness bound: a trajectory served by weights too old for its step is aborted by the loop, its agent
  process is ended, the trajectory is counted as stale-aborted and restarted with a new agent run.

The workers of the first two are `python -m agents.worker` processes (the emulated engine, so a turn is slow
enough to interrupt and its length is exactly `max_tokens`); the trainer is a real GRPO trainer server.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession

from agents.driver import RolloutDriver
from agents.engines.emulated import EmulatedEngine
from agents.envs import agent as agent_env
from controlplane.core import driver_link as dl
from controlplane.core.state import Role
from tests.support.gateway import SECRET, WorkerProc, run_agent_job, serve_engine

MAX_TOKENS = 160  # the agent's one turn: the emulated engine always decodes exactly this many tokens

# One request with the official SDK (no retries: any error would reach the agent and fail its run), the
# answer written where the test reads it, the reward as the last stdout line.
ONE_TURN_AGENT = f"""
import json, os, sys
from openai import OpenAI
open(os.path.join(os.environ["OUT"], "pid-" + str(os.getpid())), "w").write(os.environ["OPENAI_API_KEY"])
c = OpenAI(max_retries=0, timeout=300)
out = c.chat.completions.create(model="tiny", messages=[{{"role": "user", "content": "count"}}],
                                max_tokens={MAX_TOKENS}, extra_body={{"return_token_ids": True}})
ch = out.choices[0]
with open(os.path.join(os.environ["OUT"], "answer-" + str(os.getpid())), "w") as f:
    json.dump({{"token_ids": ch.model_extra["token_ids"], "finish": ch.finish_reason,
               "content": ch.message.content}}, f)
if len(sys.argv) > 1:
    c.chat.completions.create(model="tiny", max_tokens=4, messages=[{{"role": "user", "content": "count"}},
        {{"role": "assistant", "content": ch.message.content}}, {{"role": "user", "content": "again"}}])
    import time; time.sleep(float(sys.argv[1]))
print(json.dumps({{"reward": 1.0}}))
"""


async def run_job(
    workers: list[dl.RoutableWorker],
    agent: list[str],
    out: Path,
    *,
    act: Callable[[RolloutDriver, ClientSession], Any],
    until: Callable[[RolloutDriver, agent_env.AgentRunner], bool],
    batch: int = 1,
    group: int = 1,
    max_staleness: int = 1,
    timeout_s: float = 120.0,
    spec: dict[str, Any] | None = None,
) -> tuple[RolloutDriver, agent_env.AgentRunner]:
    """One emulated-engine agent job over `workers`, its agents writing under `out` (`OUT`)."""
    os.environ["OUT"] = str(out)
    try:
        run = await run_agent_job(
            workers,
            {"tasks": [{"n": 1}], "agent_command": agent, "agent_timeout_s": 60, **(spec or {})},
            until=lambda r: until(r.driver, r.runner),
            act=act,
            batch=batch,
            group=group,
            max_staleness=max_staleness,
            engine="emulated",
            timeout_s=timeout_s,
            every_s=0.05,
        )
        return run.driver, run.runner
    finally:
        os.environ.pop("OUT", None)


def without(driver: RolloutDriver, wid: int) -> None:
    """The control plane's next cluster view: worker `wid` is no longer in the job's serving set."""
    view = driver.cluster
    assert view is not None
    rest = [w for w in view.workers if w.worker != wid]
    driver.on_cluster(dataclasses.replace(view, workers=rest, borrowed=sum(w.overlap for w in rest)))


def answers(out: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("answer-*"))]


def first_done(runner: agent_env.AgentRunner) -> dict[str, Any]:
    done = [r for r in runner.records.values() if r["status"] == "done"]
    assert done, runner.records
    return done[0]


def check_one_complete_answer(out: Path, runner: agent_env.AgentRunner) -> tuple[list[int], dict[str, Any]]:
    """Exactly one answer reached the agent, complete (all `MAX_TOKENS`), and it is what was recorded."""
    got = answers(out)
    assert len(got) == 1, got
    ids = got[0]["token_ids"]
    assert len(ids) == MAX_TOKENS and got[0]["finish"] == "length"
    assert runner.failed == 0 and not [r for r in runner.records.values() if r["status"] == "failed"]
    rec = first_done(runner)
    s = rec["samples"][-1]
    assert rec["turns"] == 1 and rec["forks"] == 0
    lo = s["prompt_len"]
    assert s["tokens"][lo : lo + MAX_TOKENS] == ids and s["mask"][lo : lo + MAX_TOKENS] == [1] * MAX_TOKENS
    return ids, rec


async def test_a_worker_sigkilled_mid_request_the_agent_still_gets_one_complete_answer(tmp_path):
    (tmp_path / "agent.py").write_text(ONE_TURN_AGENT)
    a, b = WorkerProc(1, time_factor=4.0), WorkerProc(2, time_factor=1.0)
    seen: dict[str, Any] = {}

    async def kill_a_mid_decode(driver: RolloutDriver, http: ClientSession) -> None:
        if "killed" in seen:
            return
        fl = await a.inflight(http)
        if fl and len(fl[0]["tokens"]) >= 8:  # the agent's turn is decoding on A
            seen["killed"] = len(fl[0]["tokens"])
            a.proc.send_signal(signal.SIGKILL)
            a.proc.wait(10)
            without(driver, 1)  # the node agent reports the exit; the control plane drops A from the job

    try:
        views = [dl.RoutableWorker(1, Role.COLOCATED, a.url), dl.RoutableWorker(2, Role.COLOCATED, b.url)]
        driver, runner = await run_job(
            views,
            [sys.executable, str(tmp_path / "agent.py")],
            tmp_path,
            act=kill_a_mid_decode,
            until=lambda d, r: any(x["status"] == "done" for x in r.records.values()),
        )
        assert seen.get("killed"), "A never decoded the turn"
        _ids, rec = check_one_complete_answer(tmp_path, runner)
        # the killed worker's answer never came: the turn was served, whole, by B
        assert rec["samples"][-1]["workers"] == [[2]]
        assert driver.loop.steps[0].interruptions >= 1
    finally:
        a.stop()
        b.stop()


async def test_a_borrowed_worker_returned_mid_request_resumes_the_turn_from_its_prefix(tmp_path):
    (tmp_path / "agent.py").write_text(ONE_TURN_AGENT)
    lent, own = WorkerProc(1, time_factor=4.0), WorkerProc(2, time_factor=1.0)
    seen: dict[str, Any] = {}

    async def return_lent_mid_decode(driver: RolloutDriver, http: ClientSession) -> None:
        if "partial" in seen:
            return
        fl = await lent.inflight(http)
        if fl and len(fl[0]["tokens"]) >= 8:
            # Training Begin: the control plane drains the borrowed worker (its in-flight turns come back
            # aborted, with their partial outputs) and takes it out of the job's serving set
            async with http.post(
                f"{lent.url}/drain", json={"mode": "abort"}, headers={"Authorization": f"Bearer {SECRET}"}
            ) as r:
                assert r.status == 200
                seen["partial"] = (await r.json())["aborted"][0]["tokens"]
            without(driver, 1)

    try:
        views = [
            dl.RoutableWorker(1, Role.COLOCATED, lent.url, overlap=True),
            dl.RoutableWorker(2, Role.COLOCATED, own.url),
        ]
        driver, runner = await run_job(
            views,
            [sys.executable, str(tmp_path / "agent.py")],
            tmp_path,
            act=return_lent_mid_decode,
            until=lambda d, r: any(x["status"] == "done" for x in r.records.values()),
        )
        partial = seen.get("partial")
        assert partial, "the borrowed worker never decoded the turn"
        ids, rec = check_one_complete_answer(tmp_path, runner)
        # resumed, not restarted: the answer starts with the returned worker's partial output, the rest
        # decoded on the dedicated worker; the turn is one sampled segment of the trajectory
        assert 0 < len(partial) < MAX_TOKENS and ids[: len(partial)] == partial
        # the turn lists both workers that served it: the returned one (its prefix), then the dedicated one
        assert rec["samples"][-1]["workers"] == [[1, 2]] and driver.loop.steps[0].interruptions >= 1
    finally:
        lent.stop()
        own.stop()


class LaggingEngine(EmulatedEngine):
    """An engine that missed a weight update and serves its old weights anyway (it ignores the turn's
    `min_weight_version`): the one way a turn's data gets too stale past the workers' admission check, as
    the loop's own tests model it (`ToyWorld.stale_engine`)."""

    def admit(self, verb: str, min_weight_version: int = 0) -> None:
        super().admit(verb, 0)


async def test_a_stale_trajectory_is_aborted_its_agent_ended_and_restarted(tmp_path):
    # the first run (step 0) answers and ends; later runs go on for a minute after their first answer
    agent = ONE_TURN_AGENT.replace(f"max_tokens={MAX_TOKENS}", "max_tokens=4").replace(
        "if len(sys.argv) > 1:", "if os.path.exists(os.path.join(os.environ['OUT'], 'first-ended')):"
    )
    agent = agent.replace(
        'print(json.dumps({"reward": 1.0}))',
        "open(os.path.join(os.environ['OUT'], 'first-ended'), 'w').close()\nprint(json.dumps({\"reward\": 1.0}))",
    )
    (tmp_path / "agent.py").write_text(agent)
    wrunner, url, _ = await serve_engine(LaggingEngine(model="qwen3-8b", time_factor=0.2, worker_id=1))
    envs: dict[str, agent_env.AgentEnvironment] = {}

    async def nothing(driver: RolloutDriver, http: ClientSession) -> None:
        return None

    def ended_while_the_job_runs(d: RolloutDriver, r: agent_env.AgentRunner) -> bool:
        for tid, ep in d.episodes.items():
            if isinstance(ep.env, agent_env.AgentEnvironment):
                envs.setdefault(tid, ep.env)
        stale = [e for t, e in envs.items() if t.startswith("s1-") and e.status == "aborted"]
        # step 1 needs weights v1 (max_staleness 0); its turn comes back from v0: stale. Done once a stale
        # run's agent process has ended (before the job stops) and its replacement's agent has started.
        return any(e.proc is not None and e.proc.returncode is not None for e in stale) and any(
            e.proc is not None and e.status == "running" for t, e in envs.items() if "-r" in t
        )

    try:
        driver, runner = await run_job(
            [dl.RoutableWorker(1, Role.COLOCATED, url)],
            [sys.executable, str(tmp_path / "agent.py")],
            tmp_path,
            act=nothing,
            until=ended_while_the_job_runs,
            max_staleness=0,
        )
        assert runner.records["s0-t0"]["status"] == "done"
        # aborted while the job ran (the replacement still running when the test stops the job is aborted then)
        stale = {
            n: r for n, r in runner.records.items() if r["status"] == "aborted" and r["reason"] != "the job stopped"
        }
        assert stale and all(n.startswith("s1-t0") for n in stale)
        assert all(r["reason"].startswith("stale: step 1 has data from weights v0") for r in stale.values()), stale
        assert driver.loop.stale_aborted == driver.loop.steps[1].stale_aborted == len(stale)
        assert runner.failed == 0  # aborted, not failed: a stale run is no fault of the agent
        # the stale turn's answer never reached the agent: the loop ended the run on that turn
        assert all(r["turns"] == 0 and not r["messages"] for r in stale.values()), stale
        for name in stale:  # the aborted run's agent (its process group) was ended
            proc = envs[name].proc
            assert proc is not None and proc.returncode is not None
            with pytest.raises(ProcessLookupError):
                os.kill(proc.pid, 0)
        # the replacements run new agent processes on the same task
        assert any(n.startswith("s1-t0-r") for n in envs)
    finally:
        await wrunner.cleanup()


@pytest.fixture(autouse=True)
def _no_leftover_runner():
    yield
    agent_env._RUNNER = None
