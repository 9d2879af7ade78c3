"""The driver's turn journal (issue 34): what a driver journals of a trajectory's finished turns reloads in a
restarted driver, a torn last line (the crash mid-write) left out; the journal stays within its bound and goes
when its trajectory or step is done. And a restarted driver continues a journaled trajectory from its last
finished turn (its environment restored, its prefix's samples as they were sampled) instead of rerunning it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from agents.driver import RolloutDriver
from agents.driver import journal as jr
from agents.driver.journal import JournaledTrajectory, JournaledTurn, TurnJournal
from agents.driver.trajectories import episode_record, summarize
from agents.envs import make_env
from controlplane.core import loop as lp
from controlplane.core.state import Role
from tests.support.driver import Sink, holding, job_view
from tests.unit.core.loop_world import ToyWorld, run_heap


def _turn(k: int, n: int = 3) -> JournaledTurn:
    return JournaledTurn(
        response=[100 + k] * n,
        logprobs=[-0.5 - k] * n,
        weight_version=k,
        workers=[k, k + 1],
        observation=[7, 8],
        max_tokens=4 + k,
        env={"k": k + 1},
    )


def _head(tid: str = "s3-t1", step: int = 3) -> JournaledTrajectory:
    return JournaledTrajectory(tid, step, prompt=[1, 2, 3], budget=5, version=2)


def test_turns_written_reload_in_order_in_a_new_journal(tmp_path: Path) -> None:
    journal = TurnJournal(tmp_path)
    assert journal.begin(_head())
    for k in range(3):
        assert journal.append("s3-t1", _turn(k))
    loaded = TurnJournal(tmp_path).load()  # as a restarted driver reads it
    assert list(loaded) == ["s3-t1"]
    j = loaded["s3-t1"]
    assert (j.step, j.prompt, j.budget, j.version) == (3, [1, 2, 3], 5, 2)
    assert j.turns == [_turn(0), _turn(1), _turn(2)]  # the log-probs exactly as written


def test_a_torn_last_line_is_left_out_and_a_bad_line_ends_the_turns(tmp_path: Path) -> None:
    journal = TurnJournal(tmp_path)
    journal.begin(_head())
    journal.append("s3-t1", _turn(0))
    journal.append("s3-t1", _turn(1))
    path = tmp_path / "s3-t1.jsonl"
    whole = path.read_bytes()
    path.write_bytes(whole[:-7])  # the crash cut the second turn's line short
    assert TurnJournal(tmp_path).load()["s3-t1"].turns == [_turn(0)]
    path.write_bytes(whole[:-1])  # complete JSON but no newline: still torn
    assert TurnJournal(tmp_path).load()["s3-t1"].turns == [_turn(0)]
    lines = whole.split(b"\n")
    path.write_bytes(b"\n".join([lines[0], b'{"response": [1]}', lines[2], b""]))  # a bad line: nothing after it
    assert TurnJournal(tmp_path).load()["s3-t1"].turns == []


def test_an_unreadable_header_or_half_made_file_is_removed_on_load(tmp_path: Path) -> None:
    (tmp_path / "s1-t0.jsonl").write_bytes(b'{"v": 1, "traj')
    (tmp_path / "s1-t1.tmp").write_bytes(b"{}")
    TurnJournal(tmp_path).begin(_head("s1-t2", 1))
    assert list(TurnJournal(tmp_path).load()) == ["s1-t2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s1-t2.jsonl"]


def test_removed_when_done_and_per_step_and_an_append_never_recreates(tmp_path: Path) -> None:
    journal = TurnJournal(tmp_path)
    for tid, step in (("s1-t0", 1), ("s1-t1", 1), ("s10-t0", 10), ("s2-t0-r1", 2)):
        journal.begin(_head(tid, step))
    journal.remove("s1-t0")
    assert not journal.append("s1-t0", _turn(0))  # its trajectory was aborted meanwhile: stays gone
    journal.remove_step(1)
    assert sorted(TurnJournal(tmp_path).load()) == ["s10-t0", "s2-t0-r1"]
    journal.prune({"s2-t0-r1"})
    assert sorted(TurnJournal(tmp_path).load()) == ["s2-t0-r1"]


def test_a_trajectory_past_the_bound_is_no_longer_journaled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    journal = TurnJournal(tmp_path)
    journal.begin(_head())
    monkeypatch.setattr(jr, "MAX_FILE_BYTES", (tmp_path / "s3-t1.jsonl").stat().st_size + 150)
    assert journal.append("s3-t1", _turn(0))
    assert not journal.append("s3-t1", _turn(1))  # past it: removed, so a crash reruns it (no gap resumed)
    assert TurnJournal(tmp_path).load() == {}


@pytest.mark.parametrize("env", ["calculator", "swe-like"])
def test_a_built_in_environment_restored_from_its_snapshot_goes_on_as_the_original(env: str) -> None:
    async def body() -> None:
        kw: dict[str, Any] = dict(
            task=11, member=1, seed=5, group_size=4, step=0, group=0, batch_size=8, time_factor=0.0
        )
        a, b = make_env(env, **kw), make_env(env, **kw)
        await a.reset()
        first = await a.step([ord("x")])
        assert not first.done
        b.restore(json.loads(json.dumps(a.snapshot())))
        for _ in range(200):
            ta, tb = await a.step([ord("7")]), await b.step([ord("7")])
            assert ta == tb
            if ta.done:
                break

    asyncio.run(body())


def test_an_agent_environment_has_no_snapshot() -> None:
    from agents.envs.agent import AgentEnvironment

    assert AgentEnvironment.snapshot(object.__new__(AgentEnvironment)) is None


JOB = job_view()


def test_a_restarted_driver_continues_a_journaled_trajectory_from_its_last_turn(tmp_path: Path) -> None:
    """The old driver died with step 0 live: s0-t0 had finished (the trainer holds it), s0-t1 had one finished
    turn journaled (a tool call), s0-t2 and s0-t3 none. The new driver recovers s0-t0, resumes s0-t1 from its
    journal (its replacement starts at its second turn, with the first turn's samples as sampled) and reruns the
    other two from their prompts."""
    world = ToyWorld({0: Role.COLOCATED}, turns=2)
    early, _ = run_heap(world, lp.LoopConfig(batch_size=4, group_size=2), [], until=0.1)
    checkpoint = json.loads(json.dumps(early.checkpoint())) | {"clock_epoch": 0.0}
    state = tmp_path / "driver"

    async def body() -> None:
        env = make_env("calculator", task=0, seed=0)
        prompt = list((await env.reset()).observation)
        tool = await env.step([ord("c")])  # the policy called the tool
        old = TurnJournal(state / "journal")
        old.begin(JournaledTrajectory("s0-t1", 0, prompt, 1, 0))
        old.append("s0-t1", JournaledTurn([ord("c")], [-1.25], 0, [0], list(tool.observation), 1, env.snapshot() or {}))
        old.begin(JournaledTrajectory("s0-t2", 0, prompt, 1, 0))  # no finished turn: nothing to continue

        driver = RolloutDriver(JOB, link=Sink(), token="t", checkpoint=checkpoint, state_dir=state)
        driver._trainer_call = holding({"s0-t0": 1.0})  # type: ignore[method-assign]
        started: list[str] = []
        driver._start_episode = lambda ref, step: started.append(ref.trajectory)  # type: ignore[method-assign]
        run = asyncio.create_task(driver.run())
        await asyncio.sleep(0.2)
        driver.stop()
        await run
        assert sorted(started) == ["s0-t2-r1", "s0-t3-r1"]  # only those with no finished turn run again
        assert driver.reruns == {"s0-t2-r1", "s0-t3-r1"} and driver.resumed == {"s0-t1-r1"}
        ep = driver.episodes["s0-t1-r1"]
        assert ep.resumed and ep.samples[0]["logprobs"] == [-1.25]  # the prefix as sampled, not recomputed
        assert ep.samples[0]["prompt_tokens"] == prompt and ep.context == [*prompt, ord("c"), *tool.observation]
        # its environment is where the old one was: the tool was called, the next turn is the answer
        assert ep.env.snapshot() == {"called": True, "turns": 1}
        # the journal goes on under the replacement's id; the old files are gone
        assert sorted(p.name for p in (state / "journal").iterdir()) == ["s0-t1-r1.jsonl"]
        record = summarize("s0-t1-r1", episode_record(ep.samples, 1.0) | {"resumed": True})
        assert record.resumed and record.sample_lens == [len(prompt) + 1] and record.mask[-1] == 1

    asyncio.run(body())


def test_kept_records_reload_and_a_bad_file_is_removed(tmp_path: Path) -> None:
    kept = jr.RecordJournal(tmp_path)
    assert kept.keep("s0-t0", 0, {"reward": 1.0, "turns": 2})
    assert not kept.keep("../x", 0, {})  # not a file name: nothing kept
    (tmp_path / "s0-t1.json").write_text("{not json")
    (tmp_path / "s0-t2.tmp").write_text("half")
    assert jr.RecordJournal(tmp_path).load() == {"s0-t0": (0, {"reward": 1.0, "turns": 2})}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s0-t0.json"]


def test_a_restarted_driver_reports_the_records_its_predecessor_kept_of_what_the_trainer_holds(
    tmp_path: Path,
) -> None:
    """The old driver died after s0-t0's samples were durable at the trainer but before its record went out, and
    after keeping s0-t2's record but before the trainer took its samples. The new driver reports s0-t0's kept
    record (the audit lists it) and drops s0-t2's (it runs again and reports its own)."""
    world = ToyWorld({0: Role.COLOCATED}, turns=2)
    early, _ = run_heap(world, lp.LoopConfig(batch_size=4, group_size=2), [], until=0.1)
    checkpoint = json.loads(json.dumps(early.checkpoint())) | {"clock_epoch": 0.0}
    state = tmp_path / "driver"
    old = jr.RecordJournal(state / "records")
    old.keep("s0-t0", 0, episode_record([], 1.0, tokens=False) | {"turns": 2})
    old.keep("s0-t2", 0, episode_record([], 0.0, tokens=False))

    async def body() -> None:
        sink = Sink()
        driver = RolloutDriver(JOB, link=sink, token="t", checkpoint=checkpoint, state_dir=state)
        driver._trainer_call = holding({"s0-t0": 1.0})  # type: ignore[method-assign]
        driver._start_episode = lambda ref, step: None  # type: ignore[method-assign]
        run = asyncio.create_task(driver.run())
        await asyncio.sleep(0.2)
        driver.stop()
        await run
        await driver._report_trajectories()
        names = [t.name for m in sink.sent for t in getattr(m, "trajectories", []) or []]
        assert names.count("s0-t0") == 1 and "s0-t2" not in names
        reported = next(t for m in sink.sent for t in getattr(m, "trajectories", []) or [] if t.name == "s0-t0")
        assert reported.reward == 1.0 and reported.turns == 2 and not reported.rerun
        assert list((state / "records").iterdir()) == []  # reported: dropped; not held: dropped

    asyncio.run(body())
