"""`environment: agent` inside the real rollout driver: the example calculator agent (official openai SDK,
a subprocess per trajectory) drives the driver's trajectories through the job's gateway; the turns are
sampled by the driver's own routing on a real torch engine worker, the samples go to a real GRPO trainer,
which trains the step. A failing agent is a failed trajectory the loop restarts, never a reward."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from agents.driver import RolloutDriver
from agents.envs import agent as agent_env
from agents.process import REPO_ROOT
from controlplane.core import driver_link as dl
from controlplane.core import loop as lp
from controlplane.core.state import Role
from tests.support.gateway import run_agent_job, start_worker

AGENT = [sys.executable, str(REPO_ROOT / "examples" / "agents" / "calculator_agent.py")]


async def run_job(
    tmp_path,
    agent: list[str],
    *,
    until,
    batch: int = 4,
    group: int = 2,
    timeout_s: float = 120,
    report: bool = False,
    extra: dict[str, Any] | None = None,
):
    """The calculator tasks on a torch worker (in process); `until(driver, runner, trainer)`; `extra` overrides
    spec fields (an agent_function instead of the command)."""
    wrunner, wurl, _ = await start_worker("torch")
    spec = {"tasks": [{"a": 1, "b": 2}, {"a": 3, "b": 4}], "agent_command": agent, "agent_timeout_s": 30}
    spec |= extra or {}
    try:
        run = await run_agent_job(
            [dl.RoutableWorker(1, Role.COLOCATED, wurl)],
            spec,
            until=lambda r: until(r.driver, r.runner, r.trainer),
            batch=batch,
            group=group,
            report=report,
            timeout_s=timeout_s,
        )
        return run.driver, run.runner, run.posted
    finally:
        await wrunner.cleanup()


FUNCTION = {"agent_command": None, "agent_function": "examples.agents.calculator_agent:run"}


@pytest.mark.parametrize(
    "extra",
    [{}, FUNCTION, FUNCTION | {"agent_isolation": "inline"}],
    ids=["command", "function-pool", "function-inline"],
)
async def test_an_openai_sdk_agent_is_a_job_environment_trained_on_the_tokens_it_was_sampled(
    tmp_path, monkeypatch, extra
):
    monkeypatch.syspath_prepend(str(REPO_ROOT))  # the function's module (the pool processes get the driver's path)
    driver, runner, posted = await run_job(tmp_path, AGENT, until=lambda d, r, t: bool(d.trained), extra=extra)
    if extra:  # the driver imported the function only inline (the pool's processes ran it otherwise)
        assert (runner._function is not None) == (extra.get("agent_isolation") == "inline")
    assert driver.trained[0]["step"] == 0 and driver.trained[0]["samples"] >= 1
    done = [rec for rec in runner.records.values() if rec["status"] == "done"]
    assert len(done) >= 4 and runner.failed == 0
    # the gateway's record of each trajectory: the first prompt is the template of the agent's message,
    # each sampled segment is masked 1 and carries the engine's log-probs
    for rec in done:
        s = rec["samples"][-1]
        assert s["mask"][: s["prompt_len"]] == [0] * s["prompt_len"] and sum(s["mask"]) >= 1
        assert all(lp < 0 for lp, m in zip(s["logprobs"], s["mask"]) if m)
        assert rec["reward"] is not None
    # what the trainer got is, turn for turn, what the gateway recorded: prompt, sampled ids, log-probs
    recorded = {}
    for rec in done:
        for s in rec["samples"]:
            for seg_start, seg_end in _sampled_segments(s["mask"]):
                key = (tuple(s["tokens"][:seg_start]), tuple(s["tokens"][seg_start:seg_end]))
                recorded[key] = s["logprobs"][seg_start:seg_end]
    trained = [x for x in posted if x.trajectory]
    assert trained and all((tuple(x.prompt_tokens), tuple(x.completion_tokens)) in recorded for x in trained)
    for x in trained:
        assert x.logprobs == pytest.approx(recorded[(tuple(x.prompt_tokens), tuple(x.completion_tokens))])


def _sampled_segments(mask: list[int]) -> list[tuple[int, int]]:
    out, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out


async def test_a_failing_agent_is_a_failed_trajectory_restarted_by_the_loop(tmp_path):
    flaky = tmp_path / "flaky.py"
    flaky.write_text("import sys\nsys.stderr.write('agent crashed\\n')\nsys.exit(1)\n")
    driver, runner, posted = await run_job(
        tmp_path, [sys.executable, str(flaky)], until=lambda d, r, t: d.loop.trained_next >= 1, timeout_s=120
    )
    # no sample, no reward was made up for a failed run; a step whose members all gave up publishes no weights
    assert not posted and not driver.trained and driver.loop.version == 0
    assert not [m for m in driver.link.sent if isinstance(m, dl.UpdateRequest)] and driver.waiting_version is None
    assert driver.loop.trained_next >= 1 and driver.loop.skipped == [0] * driver.loop.trained_next
    aborts = [t for t in driver.loop.trajs.values() if t.state.name == "ABORTED"]
    assert len(aborts) >= 4  # each failure was restarted on its task
    failed = [rec for rec in runner.records.values() if rec["status"] == "failed"]
    assert all("agent crashed" in rec["stderr"] for rec in failed)


async def test_an_aborted_trajectory_ends_its_agent_and_a_replacement_starts(tmp_path):
    """The loop aborts a trajectory (a stale one, say): the driver ends its agent's process group; the
    replacement on the same task runs a new agent."""
    slow = tmp_path / "slow.py"
    slow.write_text(
        "import time\nfrom openai import OpenAI\n"
        "OpenAI(max_retries=0).chat.completions.create(model='tiny', messages=[{'role': 'user', 'content': 'x'}],"
        " max_tokens=2)\ntime.sleep(60)\n"
    )
    seen: dict[str, Any] = {}

    def aborted_one(d: RolloutDriver, r: agent_env.AgentRunner, _: Any) -> bool:
        if "env" not in seen:
            live = [
                (tid, ep.env)
                for tid, ep in d.episodes.items()
                if isinstance(ep.env, agent_env.AgentEnvironment)
                and ep.env.pending is None
                and ep.env.proc is not None
                and ep.env.session is not None
                and ep.env.session.turns
            ]  # answered once, the agent now sleeping
            if not live:
                return False
            tid, env = live[0]
            seen.update(env=env, tid=tid)
            d.abort(lp.Abort(tid, "stale: test"))  # the loop's command, as for a stale trajectory
            return False
        env = seen["env"]
        return env.status == "aborted" and env.proc.returncode is not None

    driver, runner, _ = await run_job(tmp_path, [sys.executable, str(slow)], until=aborted_one, timeout_s=60)
    env = seen["env"]
    assert runner.records[env.trajectory]["status"] == "aborted"
    assert runner.records[env.trajectory]["reason"] == "stale: test"
    assert seen["tid"] not in driver.episodes


async def test_the_driver_reports_each_ended_trajectory_under_the_loops_id(tmp_path):
    """With the spec in its JobView (as a live driver gets it) the driver reports every ended trajectory once,
    per step, under the loop's trajectory id, with the tokens and mask the gateway recorded."""
    driver, runner, posted = await run_job(tmp_path, AGENT, until=lambda d, r, t: bool(d.trained), report=True)
    reports = [m for m in driver.link.sent if isinstance(m, dl.TrajectoryReport)]
    got = [(m.step, t) for m in reports for t in m.trajectories]
    done = [t for step, t in got if t.status == "done"]
    assert len(done) >= 4 and not runner.records  # taken from the runner as reported
    assert all(step == 0 and t.name.startswith("s0-t") for step, t in got if t.status == "done")
    assert len({t.name for _, t in got}) == len(got)  # each once
    for t in done:
        assert t.reward is not None and sum(t.mask) >= 1 and len(t.tokens) == len(t.mask) == t.token_count
        assert t.turns == len(t.weight_versions) >= 1 and t.messages and t.messages[0]["role"] == "user"
    trained = {(tuple(x.prompt_tokens), tuple(x.completion_tokens)) for x in posted if x.trajectory}
    assert any(tuple(t.tokens[: len(p)]) == p for t in done for p, _ in trained)
