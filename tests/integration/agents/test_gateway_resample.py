"""A failed agent run is resampled, but not forever, and never stalls its job: inside the real driver, a group
member whose agent fails `agent_max_attempts` times is given up (its last failure is reported as final, no
agent is run for it again) and the loop trains its step on the group's surviving members; the job goes on to
its next step. Before, the member's replacement waited without an agent and the step never trained."""

from __future__ import annotations

import os
import sys
from dataclasses import replace

from aiohttp import ClientSession

from agents.driver import RolloutDriver
from agents.engines.emulated import EmulatedEngine
from agents.envs import agent as agent_env
from controlplane.core import driver_link as dl
from controlplane.core.state import Role
from controlplane.core.telemetry import RecordKind
from tests.integration.agents.test_gateway_guarantees import run_job
from tests.support.gateway import Link, run_agent_job, serve_engine

# Agents run one at a time (agent_concurrency 1), in the order they start; each claims its place in that order
# (an O_EXCL file) and the ones whose place is in argv break: one request with the official SDK, then the tool
# crashes. The rest answer with a reward.
AGENT = """
import itertools, json, os, sys
from openai import OpenAI
for i in itertools.count():
    try:
        os.close(os.open(os.path.join(os.environ["OUT"], f"start-{i}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        break
    except FileExistsError:
        continue
OpenAI(max_retries=0).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=2)
if str(i) in sys.argv[1:]:
    sys.stderr.write("the tool is broken\\n")
    sys.exit(2)
print(json.dumps({"reward": float(i % 2)}))
"""


async def test_a_member_that_keeps_failing_is_given_up_and_its_step_trains_the_rest_of_its_group(tmp_path):
    (tmp_path / "agent.py").write_text(AGENT)
    wrunner, url, _ = await serve_engine(EmulatedEngine(model="qwen3-8b", time_factor=0.1, worker_id=1))

    async def nothing(driver: RolloutDriver, http: ClientSession) -> None:
        return None

    def two_steps_trained(d: RolloutDriver, r: agent_env.AgentRunner) -> bool:
        return len(d.trained) >= 2

    try:
        # step 0: its three members start one after another, then the first one's resample: places 0 and 3 break
        driver, runner = await run_job(
            [dl.RoutableWorker(1, Role.COLOCATED, url)],
            [sys.executable, str(tmp_path / "agent.py"), "0", "3"],
            tmp_path,
            act=nothing,
            until=two_steps_trained,
            batch=3,
            group=3,
            spec={"agent_max_attempts": 2, "agent_concurrency": 1},
        )
        failed = {n: rec for n, rec in runner.records.items() if rec["status"] == "failed"}
        (member,) = {agent_env.member_of(n) for n in failed}  # whichever started first (their order may vary)
        assert member.startswith("s0-t") and sorted(failed) == [member, f"{member}-r1"]
        assert runner.failed == 2  # exactly agent_max_attempts runs
        first, last = failed[member], failed[f"{member}-r1"]
        assert not first["final"] and first["attempt"] == 1 and "not resampled again" not in first["reason"]
        assert last["final"] and last["attempt"] == 2 and "final, not resampled again" in last["reason"]
        assert runner.gave_up == {member: last["reason"]}
        assert all("the tool is broken" in rec["stderr"] for rec in failed.values())
        assert f"{member}-r2" not in runner.records and f"{member}-r2" not in driver.episodes  # no third run
        # the step trained on the two members left, and the job went on to step 1 with a full group
        assert [t["step"] for t in driver.trained[:2]] == [0, 1]
        assert driver.trained[0]["samples"] == 2 and driver.trained[1]["samples"] == 3
        link = driver.link
        assert isinstance(link, Link)
        sent = [x for m in link.sent if isinstance(m, dl.TelemetryReport) for x in m.records]
        steps = [r for r in driver.records + sent if r.get("kind") == RecordKind.STEP]
        s0 = next(r for r in steps if r.get("step", 0) == 0)
        assert s0["given_up"] == 1 and "dropped_groups" not in s0 and s0["batch_size"] == 3
        assert driver.loop.failed_trajectories == 2
    finally:
        os.environ.pop("OUT", None)
        await wrunner.cleanup()


def reported(link: Link, step: int) -> dict[str, dl.TrajectorySummary]:
    """The trajectories of `step` the driver reported over the (in-process) link, by name, each with `trained`
    and `reason` as the step's TrainedReports (sent once its update committed) set them on their records."""
    out: dict[str, dl.TrajectorySummary] = {}
    for m in link.sent:
        if isinstance(m, dl.TrajectoryReport) and m.step == step:
            out |= {t.name: t for t in m.trajectories}
        elif isinstance(m, dl.TrainedReport) and m.step == step:
            out |= {n: replace(out[n], trained=True) for n in m.trained if n in out}
            out |= {n: replace(out[n], trained=False, reason=m.reason) for n in m.untrained if n in out}
    return out


def audited(link: Link, step: int) -> bool:
    """The step's update committed and the driver said so (after the trajectories' own reports)."""
    return any(isinstance(m, dl.TrainedReport) and m.step == step for m in link.sent)


async def test_a_finished_member_of_a_dropped_group_is_reported_as_not_trained(tmp_path):
    """Groups of 2: the first agent to start fails for good (agent_max_attempts 1), so its group keeps one
    finished member, which is dropped from the update: the driver reports it done with `trained: false` and
    why, the other group's members `trained: true`, the given-up one with no `trained`. Each is reported as it
    ends with no `trained` (its update has not committed); the step's TrainedReport says it after the update."""
    (tmp_path / "agent.py").write_text(AGENT)
    os.environ["OUT"] = str(tmp_path)
    wrunner, url, _ = await serve_engine(EmulatedEngine(model="qwen3-8b", time_factor=0.1, worker_id=1))
    spec = {
        "tasks": [{"n": 1}],
        "agent_command": [sys.executable, str(tmp_path / "agent.py"), "0"],
        "agent_timeout_s": 60,
        "agent_max_attempts": 1,
        "agent_concurrency": 1,
    }
    try:
        run = await run_agent_job(
            [dl.RoutableWorker(1, Role.COLOCATED, url)],
            spec,
            until=lambda r: len(reported(r.driver.link, 0)) == 4 and audited(r.driver.link, 0),
            batch=4,
            group=2,
            engine="emulated",
            report=True,
            every_s=0.05,
        )
        link = run.driver.link
        assert isinstance(link, Link)
        got = reported(link, 0)
        assert all(t.trained is None for m in link.sent if isinstance(m, dl.TrajectoryReport) for t in m.trajectories)
        (gone,) = [n for n, t in got.items() if t.status == "failed"]
        index = int(gone.split("-t")[1])
        mate = f"s0-t{index ^ 1}"  # its group's other member
        assert got[gone].trained is None and "final" in got[gone].reason
        assert got[mate].status == "done" and got[mate].trained is False
        assert got[mate].reason.startswith("not trained: its group was dropped"), got[mate].reason
        rest = [t for n, t in got.items() if n not in (gone, mate)]
        assert len(rest) == 2 and all(t.status == "done" and t.trained is True and not t.reason for t in rest)
        assert run.driver.trained[0]["samples"] == 2  # the other group's two members
    finally:
        os.environ.pop("OUT", None)
        await wrunner.cleanup()
