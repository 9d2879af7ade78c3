"""The driver's trajectory reports (issue 19): an agent job's ended trajectories are summarised within the
link's bounds, grouped per step in frames under the link's limit, sent once and taken from the runner's
records (which so do not pile up); a failed send keeps them for the next flush."""

from __future__ import annotations

import json

import pytest

from agents.driver import RolloutDriver
from agents.driver.trajectories import reports, step_of, summarize
from agents.envs import agent as agent_env
from controlplane.core import driver_link as dl

JOB = dl.JobView(
    name="calc-agent",
    environment="agent",
    model="tiny",
    engine="torch",
    batch_size=4,
    group_size=2,
    max_staleness=1,
    max_trajectory_tokens=512,
    return_deadline_s=30.0,
    agent={"agent_command": ["python", "a.py"], "tasks": [{"q": 1}]},
)


def _rec(n: int = 4, **extra) -> dict:
    return {
        "samples": [
            {
                "tokens": list(range(n)),
                "mask": [0, 1] * (n // 2),
                "logprobs": [0.0, -1.0] * (n // 2),
                "weight_versions": [1],
                "workers": [0],
                "latency_s": [0.5],
            }
        ],
        "reward": 1.0,
        "turns": 1,
        "status": "done",
        "messages": [],
        **extra,
    }


class Link:
    def __init__(self, fail: int = 0) -> None:
        self.sent: list = []  # TrajectoryReport, TrainedReport
        self.fail = fail

    async def send(self, msg) -> None:
        if self.fail:
            self.fail -= 1
            raise ConnectionError("link down")
        dl.DRIVER_LINK.parse(
            json.loads(json.dumps(dl.DRIVER_LINK.dump(msg))), dl.DRIVER_MESSAGES
        )  # what the control plane accepts
        self.sent.append(msg)


def test_step_of_reads_the_loops_trajectory_ids():
    assert step_of("s12-t3") == 12 and step_of("s0-t1-r2") == 0 and step_of("task7-m0", 5) == 5


def test_summaries_are_bounded_and_storable():
    big = "ü" * 10_000 + "\x00"
    rec = _rec(
        reason=big, stderr=big, messages=[{"role": "user", "content": big}] * 200, reward=float("nan"), status="strange"
    )
    s = summarize("s0-t0", rec)
    assert s.reward is None and s.status == "done"
    assert len(s.reason) <= dl.MAX_MESSAGE_CHARS and "\x00" not in s.reason
    assert 1 <= len(s.messages) <= dl.MAX_TRAJECTORY_MESSAGES
    (msg,) = reports([(0, s)])
    assert len(json.dumps(dl.DRIVER_LINK.dump(msg))) < dl.MAX_REPORT_BYTES
    dl.DRIVER_LINK.parse(json.loads(json.dumps(dl.DRIVER_LINK.dump(msg))), dl.DRIVER_MESSAGES)


def test_each_turn_lists_every_worker_that_served_it_and_crosses_the_link():
    rec = _rec()
    rec["samples"][0]["workers"] = [[3, 1]]  # a turn resumed on worker 1 after worker 3 was returned
    rec["samples"].append({**rec["samples"][0], "workers": [list(range(40))]})  # resumed past the bound
    s = summarize("s0-t0", rec)
    assert s.workers == [[3, 1], list(range(16))]
    back = dl.DRIVER_LINK.parse(
        json.loads(json.dumps(dl.DRIVER_LINK.dump(dl.TrajectoryReport(0, [s])))), dl.DRIVER_MESSAGES
    )
    assert back.trajectories[0].workers == [[3, 1], list(range(16))]
    assert summarize("s0-t1", _rec()).workers == [[0]]  # a record of one id per turn (before)


def test_reports_are_per_step_and_split_under_the_frame_limit():
    many = [(0, summarize(f"s0-t{i}", _rec(n=dl.MAX_TRAJECTORY_TOKENS))) for i in range(40)]
    out = reports([*many, (1, summarize("s1-t0", _rec()))])
    assert len(out) > 2 and {m.step for m in out} == {0, 1}
    assert sum(len(m.trajectories) for m in out) == 41
    assert all(len(json.dumps(dl.DRIVER_LINK.dump(m))) <= dl.MAX_REPORT_BYTES for m in out)


@pytest.mark.asyncio
async def test_the_driver_reports_ended_trajectories_once_and_keeps_them_across_a_failed_send():
    link = Link(fail=1)
    driver = RolloutDriver(JOB, link=link, token="t")
    records = agent_env.runner().records
    records["s0-t0"] = _rec()
    records["s1-t0-r1"] = _rec(status="failed", reward=None, reason="the agent exited with status 1")
    with pytest.raises(ConnectionError):
        await driver._report_trajectories()
    assert not records and len(driver._unreported) == 2  # taken from the runner, kept until sent
    await driver._report_trajectories()
    await driver._report_trajectories()  # nothing new: nothing sent
    assert [(m.step, [t.name for t in m.trajectories]) for m in link.sent] == [(0, ["s0-t0"]), (1, ["s1-t0-r1"])]
    assert link.sent[1].trajectories[0].reason == "the agent exited with status 1"
    assert not driver._unreported


@pytest.mark.asyncio
async def test_a_steps_trained_report_goes_after_its_records_in_bounded_frames_and_names_the_skipped():
    """Issue 34: the records are listed as they end, with no `trained`; what a step's committed update consumed
    (and left out, and why) follows them, never before one of them is delivered; a step left without an
    update (every group dropped) reports its finished members untrained when the next step starts."""
    from controlplane.core import loop as lp

    link = Link(fail=1)
    driver = RolloutDriver(JOB, link=link, token="t")
    agent_env.runner().records["s0-t0"] = _rec()
    names = [f"s0-t{i}" for i in range(300)]
    driver._audit_trained(0, 1, names, ["s0-x"])
    with pytest.raises(ConnectionError):  # the record's report failed: nothing after it goes
        await driver._report_trajectories()
    await driver._report_trajectories()
    kinds = [type(m).__name__ for m in link.sent]
    assert kinds == ["TrajectoryReport", "TrainedReport", "TrainedReport"]
    first, second = link.sent[1:]
    assert isinstance(first, dl.TrainedReport) and isinstance(second, dl.TrainedReport)
    assert link.sent[0].trajectories[0].trained is None
    assert first.trained + second.trained == names and len(first.trained) == dl.MAX_TRAJECTORIES
    assert first.untrained == ["s0-x"] and first.reason.startswith("not trained: its group was dropped")
    assert second.untrained == [] and second.reason == ""

    # step 1 skipped (nothing trained): its finished members are let go at step 2's start, reported untrained
    class Episode:
        step = 1

    driver.episodes = {"s1-t0": Episode(), "s1-t1": Episode()}  # type: ignore[dict-item]
    driver.loop.trained_next = 2
    driver._start_episode = lambda ref, step: None  # type: ignore[method-assign]
    driver.start_step(lp.StartStep(2, 1, ()))
    await driver._report_trajectories()
    (skipped,) = link.sent[3:]
    assert isinstance(skipped, dl.TrainedReport) and skipped.step == 1 and skipped.untrained == ["s1-t0", "s1-t1"]
    assert not driver.episodes
