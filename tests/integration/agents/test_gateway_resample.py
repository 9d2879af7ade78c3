"""A failed agent run is resampled, but not forever: inside the real driver, a group member whose agent
fails `agent_max_attempts` times is given up; its last failure is reported as final and no agent is run
for it again (its replacement waits without a process)."""

from __future__ import annotations

import os
import sys

from aiohttp import ClientSession, web

from agents.driver import RolloutDriver
from agents.engines.emulated import EmulatedEngine
from agents.envs import agent as agent_env
from agents.worker import WorkerServer
from controlplane.core import driver_link as dl
from controlplane.core.state import Role
from tests.integration.agents.test_gateway import SECRET
from tests.integration.agents.test_gateway_guarantees import run_job

# a broken agent: one request (with the official SDK), then its tool crashes
AGENT = """
import os, sys
from openai import OpenAI
open(os.path.join(os.environ["OUT"], "pid-" + str(os.getpid())), "w").write(os.environ["PEARL_TASK"])
OpenAI(max_retries=0).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=2)
sys.stderr.write("the tool is broken\\n")
sys.exit(2)
"""


async def test_a_failing_group_member_is_resampled_a_bounded_number_of_times_then_reported(tmp_path):
    (tmp_path / "agent.py").write_text(AGENT)
    server = WorkerServer(EmulatedEngine(model="qwen3-8b", time_factor=0.1, worker_id=1), SECRET)
    wrunner = web.AppRunner(server.app, access_log=None)
    await wrunner.setup()
    await web.TCPSite(wrunner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{wrunner.addresses[0][1]}"

    async def nothing(driver: RolloutDriver, http: ClientSession) -> None:
        return None

    def settled(d: RolloutDriver, r: agent_env.AgentRunner) -> bool:
        # the failing member gave up and its replacement is waiting (no agent); the other member is done
        waiting = [
            ep.env
            for ep in d.episodes.values()
            if isinstance(ep.env, agent_env.AgentEnvironment) and agent_env.member_of(ep.env.trajectory) in r.gave_up
        ]
        return bool(waiting)

    try:
        driver, runner = await run_job(
            [dl.WorkerView(1, Role.COLOCATED, url)],
            [sys.executable, str(tmp_path / "agent.py")],
            tmp_path,
            act=nothing,
            until=settled,
            spec={"agent_max_attempts": 2},
        )
        failed = {n: rec for n, rec in runner.records.items() if rec["status"] == "failed"}
        members = {agent_env.member_of(n) for n in failed}
        assert len(members) == 1 and len(failed) == 2 == runner.failed  # exactly agent_max_attempts runs
        (member,) = members
        assert member == "s0-t0"
        assert runner.gave_up == {member: failed[f"{member}-r1"]["reason"]}
        first, last = failed[member], failed[f"{member}-r1"]
        assert not first["final"] and first["attempt"] == 1 and "not resampled again" not in first["reason"]
        assert last["final"] and last["attempt"] == 2 and "final, not resampled again" in last["reason"]
        assert all("the tool is broken" in rec["stderr"] for rec in failed.values())
        assert driver.loop.failed_trajectories == 2
        # no agent was started for the member's third try: it waits, with no process
        third = driver.episodes[f"{member}-r2"].env
        assert isinstance(third, agent_env.AgentEnvironment) and third.proc is None and third.session is None
        assert len(list(tmp_path.glob("pid-*"))) == 2  # agent processes started: one per attempt
    finally:
        os.environ.pop("OUT", None)
        await wrunner.cleanup()
