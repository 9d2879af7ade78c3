"""Exactly-once samples in the loop (issue 34): a restored loop takes the trajectories that finished after its
checkpoint (their samples durable at the trainer) as finished, `TrajectoryRecovered`, and restarts only the
others; the task cursor is part of the checkpoint."""

from __future__ import annotations

import json

import pytest

from controlplane.core import loop as lp
from controlplane.core.loop.state import DRIVER_RESTARTED
from controlplane.core.state import Role
from controlplane.core.telemetry import RecordKind

from .loop_world import ToyWorld, run_heap

C = Role.COLOCATED
CFG = lp.LoopConfig(batch_size=8, group_size=4, max_staleness=1, return_deadline_s=2.0)


def _done(loop: lp.RolloutLoop) -> dict[str, float]:
    return {t.tid: t.reward for t in loop.trajs.values() if t.state is lp.TrajState.DONE and t.step == loop.step}


def _checkpoint_then_more_finished() -> tuple[dict, lp.RolloutLoop]:
    """A checkpoint of step 0 mid-rollout, and the same run a little later with more trajectories finished
    (what the trainer's buffer holds when the driver died before its next checkpoint)."""
    runs = []
    for i in range(1, 80):
        loop, _ = run_heap(ToyWorld({0: C, 1: C}, turns=2), CFG, [], until=i * 0.25)
        if loop.step == 0 and loop.rollout_active and _done(loop):
            runs.append(loop)
    early, later = runs[0], runs[-1]
    assert len(_done(early)) < len(_done(later)) < CFG.batch_size, "the later run has more finished, not all"
    snap = json.loads(json.dumps(early.checkpoint()))
    return snap, later


def test_trajectories_finished_after_the_checkpoint_are_recovered_and_only_the_others_rerun() -> None:
    snap, later = _checkpoint_then_more_finished()
    at_trainer = _done(later)
    loop = lp.RolloutLoop.restore(CFG, snap)
    out: list[lp.Command] = []
    for tid, reward in at_trainer.items():
        out += loop.handle(lp.TrajectoryRecovered(5.0, tid, reward))
    out += loop.handle(lp.Start(5.0))
    aborted = {c.trajectory: c for c in out if isinstance(c, lp.Abort)}
    unfinished = {tid for tid in snap_ids(snap) if tid not in at_trainer}
    assert set(aborted) == unfinished  # no finished trajectory is run again
    assert all(c.reason == DRIVER_RESTARTED and c.replacement is not None for c in aborted.values())
    assert loop.remaining == len(unfinished)
    assert {tid: loop.trajs[tid].reward for tid in at_trainer} == at_trainer
    assert loop.finished_trajectories == later.finished_trajectories


def snap_ids(snap: dict) -> list[str]:
    return [t["tid"] for t in snap["trajectories"] if t["step"] == snap["step"]]


def test_a_batch_completed_by_recovery_trains_the_recovered_trajectories_and_starts_none_again() -> None:
    snap, _ = _checkpoint_then_more_finished()
    loop = lp.RolloutLoop.restore(CFG, snap)
    out: list[lp.Command] = []
    for tid in snap_ids(snap):
        out += loop.handle(lp.TrajectoryRecovered(5.0, tid, 1.0, turns=7))
    out += loop.handle(lp.Start(5.0))
    assert not [c for c in out if isinstance(c, lp.Abort)]
    (record,) = [c.record for c in out if isinstance(c, lp.Telemetry) and c.record.kind is RecordKind.STEP]
    assert record.turns_max == 7  # the recovered trajectories' turns, as the trainer counted their samples
    assert list(loop.ready) == [0] and loop.steps[0].remaining == 0  # collected (step 1 may start meanwhile)
    out += loop.handle(lp.ReturnConfirmed(6.0))
    train = [c for c in out if isinstance(c, lp.Train)]
    assert len(train) == 1 and sorted(t for g in train[0].groups for t in g) == sorted(snap_ids(snap))
    # a second report of the same trajectory, or of one already trained, changes nothing
    assert loop.handle(lp.TrajectoryRecovered(7.0, snap_ids(snap)[0], 0.0)) == []
    assert loop.trajs[snap_ids(snap)[0]].reward == 1.0


def test_a_recovered_trajectory_from_too_old_weights_is_restarted_as_stale() -> None:
    for until in range(10, 200, 5):
        loop, _ = run_heap(ToyWorld({0: C, 1: C}, turns=2), CFG, [], until=float(until))
        live = [t for t in loop.trajs.values() if t.step == loop.step >= 2 and t.state is not lp.TrajState.DONE]
        if loop.rollout_active and live:
            break
    else:
        raise AssertionError("no step >= 2 in flight")
    out = loop.handle(lp.TrajectoryRecovered(until + 0.1, live[0].tid, 1.0, weight_version=0))
    aborts = [c for c in out if isinstance(c, lp.Abort)]
    assert len(aborts) == 1 and aborts[0].reason.startswith("stale") and aborts[0].replacement is not None


def test_the_task_cursor_is_checkpointed_and_a_checkpoint_that_contradicts_its_step_is_refused() -> None:
    world = ToyWorld({0: C, 1: C}, turns=1)
    loop, _ = run_heap(world, CFG, [], until=30.0)
    assert loop.step >= 2
    snap = json.loads(json.dumps(loop.checkpoint()))
    assert snap["prompts_drawn"] == (loop.step + 1) * 2  # two groups of four per step
    assert lp.RolloutLoop.restore(CFG, snap).prompts_drawn == snap["prompts_drawn"]
    with pytest.raises(ValueError, match="prompts_drawn"):
        lp.RolloutLoop.restore(CFG, snap | {"prompts_drawn": snap["prompts_drawn"] - 2})
