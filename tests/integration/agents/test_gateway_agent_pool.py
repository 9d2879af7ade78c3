"""Agent functions in their pool of worker processes (`agent_isolation: process`, the default), inside the real
rollout driver with the official openai SDK: a pool process SIGKILLed mid-trajectory fails just its running
trajectories with the reason (they are resampled, the pool starts a new process, the step trains), the
loop's staleness abort cancels just that trajectory's coroutine in its pool process, an exception is a
failed trajectory whose reason is the traceback tail, and the job's stop ends the pool's processes."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession

from agents.driver import RolloutDriver
from agents.engines.emulated import EmulatedEngine
from agents.envs import agent as agent_env
from controlplane.core import driver_link as dl
from controlplane.core.state import Role
from tests.integration.agents.test_gateway_guarantees import LaggingEngine, run_job
from tests.support.gateway import serve_engine

# The test's agent functions, imported by the pool processes from the job's workdir (`agent_workdir`).
AGENTS = """
import asyncio, os

OUT = os.environ["OUT"]


async def ask(client, n=2):
    return await client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "count"}], max_tokens=n
    )


async def crash_once(client, task):
    # the first runs (before the test kills their process) wait after one answer; later runs end at once
    await ask(client)
    if not os.path.exists(os.path.join(OUT, "killed")):
        open(os.path.join(OUT, f"pid-{os.getpid()}"), "w").close()
        await asyncio.sleep(60)
    return 1.0


async def stale(client, task):
    # step 0's run answers and ends; later runs are aborted by the loop (stale) before their first answer
    try:
        await ask(client, 4)
        first = os.path.join(OUT, "first-ended")
        if not os.path.exists(first):
            open(first, "w").close()
            return 1.0
        await asyncio.sleep(60)
        return 0.0
    except asyncio.CancelledError:
        open(os.path.join(OUT, f"cancelled-{os.getpid()}-{id(asyncio.current_task())}"), "w").close()
        raise


async def broken(client, task):
    await ask(client)
    raise ValueError("the tool is broken: " + str(task))
"""


def workdir(tmp_path: Path) -> Path:
    (tmp_path / "pool_agents.py").write_text(AGENTS)
    return tmp_path


async def nothing(driver: RolloutDriver, http: ClientSession) -> None:
    return None


def spec_for(tmp_path: Path, function: str, **more: Any) -> dict[str, Any]:
    return {"agent_function": f"pool_agents:{function}", "agent_workdir": str(workdir(tmp_path))} | more


def pool_pids(runner: agent_env.AgentRunner) -> set[int]:
    return {p.pid for p in runner.pool.procs} if runner.pool is not None else set()


async def test_a_pool_process_sigkilled_mid_trajectory_fails_its_trajectories_which_are_resampled(tmp_path):
    wrunner, url, _ = await serve_engine(EmulatedEngine(model="qwen3-8b", time_factor=0.1, worker_id=1))
    seen: dict[str, Any] = {"pids": set()}

    async def kill_the_pool_process(driver: RolloutDriver, http: ClientSession) -> None:
        seen["pids"] |= pool_pids(agent_env.runner())
        if "killed" in seen:
            return
        waiting = list(tmp_path.glob("pid-*"))  # the two runs of step 0 wait in the pool's one process
        if waiting:
            pid = int(waiting[0].name.split("-")[1])
            (tmp_path / "killed").touch()  # the runs after the kill end at once
            seen["killed"] = pid
            os.kill(pid, signal.SIGKILL)

    try:
        driver, runner = await run_job(
            [dl.RoutableWorker(1, Role.COLOCATED, url)],
            [],  # the spec's agent_function instead
            tmp_path,
            act=kill_the_pool_process,
            until=lambda d, r: len(d.trained) >= 1,
            batch=2,
            group=2,
            spec=spec_for(tmp_path, "crash_once", agent_processes=1, agent_command=None),
        )
        pid = seen.get("killed")
        assert pid, "no pool process waited mid-trajectory"
        failed = {n: rec for n, rec in runner.records.items() if rec["status"] == "failed"}
        # both running trajectories were in the killed process (one process): both failed with the reason
        assert sorted(failed) == ["s0-t0", "s0-t1"], runner.records
        for rec in failed.values():
            assert f"worker process (pid {pid}) killed by SIGKILL" in rec["reason"] and not rec["final"]
        # resampled on a new pool process, and the step trained both members
        assert runner.records["s0-t0-r1"]["status"] == runner.records["s0-t1-r1"]["status"] == "done"
        assert driver.trained[0]["step"] == 0 and driver.trained[0]["samples"] == 2
        assert len(seen["pids"]) == 2 and pid in seen["pids"]
        assert runner.failed == 2 and driver.loop.failed_trajectories == 2
        # the job's stop ended the pool's processes (run_job stops the runner)
        for p in seen["pids"]:
            with pytest.raises(ProcessLookupError):
                os.kill(p, 0)
        assert runner.pool is None
    finally:
        await wrunner.cleanup()


async def test_the_staleness_abort_cancels_just_that_trajectorys_coroutine_in_its_pool_process(tmp_path):
    wrunner, url, _ = await serve_engine(LaggingEngine(model="qwen3-8b", time_factor=0.2, worker_id=1))
    seen: dict[str, Any] = {"pids": set()}

    def cancelled_while_the_job_runs(d: RolloutDriver, r: agent_env.AgentRunner) -> bool:
        seen["pids"] |= pool_pids(r)
        stale = [n for n, rec in r.records.items() if rec["status"] == "aborted" and n.startswith("s1-")]
        replaced = any("-r" in t for t in d.episodes)
        return bool(stale) and bool(list(tmp_path.glob("cancelled-*"))) and replaced

    try:
        driver, runner = await run_job(
            [dl.RoutableWorker(1, Role.COLOCATED, url)],
            [],  # the spec's agent_function instead
            tmp_path,
            act=nothing,
            until=cancelled_while_the_job_runs,
            max_staleness=0,
            spec=spec_for(tmp_path, "stale", agent_command=None),
        )
        assert runner.records["s0-t0"]["status"] == "done" and runner.records["s0-t0"]["reward"] == 1.0
        stale = {
            n: r for n, r in runner.records.items() if r["status"] == "aborted" and r["reason"] != "the job stopped"
        }
        assert stale and all(r["reason"].startswith("stale: step 1 has data from weights v0") for r in stale.values())
        assert driver.loop.stale_aborted >= 1 and runner.failed == 0
        # the abort reached the function: its coroutine was cancelled in the pool process, which lived on
        cancelled = list(tmp_path.glob("cancelled-*"))
        assert cancelled and len(seen["pids"]) == 1
        assert {int(p.name.split("-")[1]) for p in cancelled} <= seen["pids"]
    finally:
        await wrunner.cleanup()


@pytest.mark.parametrize("isolation", ["process", "inline"])
async def test_an_exception_is_a_failed_trajectory_with_the_traceback_tail(tmp_path, monkeypatch, isolation):
    monkeypatch.syspath_prepend(str(workdir(tmp_path)))  # inline: the driver imports it
    monkeypatch.delitem(sys.modules, "pool_agents", raising=False)
    wrunner, url, _ = await serve_engine(EmulatedEngine(model="qwen3-8b", time_factor=0.1, worker_id=1))
    try:
        _driver, runner = await run_job(
            [dl.RoutableWorker(1, Role.COLOCATED, url)],
            [],  # the spec's agent_function instead
            tmp_path,
            act=nothing,
            until=lambda d, r: r.failed >= 1,
            spec=spec_for(tmp_path, "broken", agent_command=None, agent_isolation=isolation),
        )
        rec = next(rec for rec in runner.records.values() if rec["status"] == "failed")
        reason = rec["reason"]
        assert reason.startswith("the agent function raised ValueError(\"the tool is broken: {'n': 1}\")")
        assert "Traceback (most recent call last)" in reason and "pool_agents.py" in reason, reason
        assert 'raise ValueError("the tool is broken: " + str(task))' in reason
    finally:
        await wrunner.cleanup()


async def test_a_function_the_pool_cannot_import_fails_its_trajectories_with_the_reason(tmp_path):
    wrunner, url, _ = await serve_engine(EmulatedEngine(model="qwen3-8b", time_factor=0.1, worker_id=1))
    try:
        _driver, runner = await run_job(
            [dl.RoutableWorker(1, Role.COLOCATED, url)],
            [],
            tmp_path,
            act=nothing,
            until=lambda d, r: r.failed >= 1,
            spec=spec_for(tmp_path, "no_such_function", agent_command=None),
        )
        rec = next(rec for rec in runner.records.values() if rec["status"] == "failed")
        assert rec["reason"].startswith("the agent function could not be loaded in its worker process")
        assert "AttributeError" in rec["reason"] and "no_such_function" in rec["reason"]
    finally:
        await wrunner.cleanup()


def test_the_pool_is_bounded_by_the_agents_concurrency() -> None:
    spec = agent_env.validate_spec({"agent_function": "m:f", "tasks": [{}], "agent_concurrency": 1})
    assert spec.isolation == "process" and agent_env.pool_size(spec) == 1
    spec = agent_env.validate_spec({"agent_function": "m:f", "tasks": [{}], "agent_processes": 8})
    assert agent_env.pool_size(spec) == 8


@pytest.mark.parametrize(
    "extra,field",
    [
        ({"agent_function": "m:f", "agent_isolation": "thread"}, "agent_isolation"),
        ({"agent_command": [sys.executable], "agent_isolation": "process"}, "agent_isolation"),
        ({"agent_function": "m:f", "agent_processes": -1}, "agent_processes"),
        ({"agent_function": "m:f", "agent_processes": True}, "agent_processes"),
    ],
)
def test_isolation_fields_are_validated(extra: dict[str, Any], field: str) -> None:
    with pytest.raises(agent_env.SpecError) as err:
        agent_env.validate_spec({"tasks": [{}], **extra})
    assert err.value.field == field


@pytest.fixture(autouse=True)
def _no_leftover_runner():
    yield
    agent_env._RUNNER = None
