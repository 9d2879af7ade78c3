"""A group member whose failure is final (an agent that failed `agent_max_attempts` times) leaves its step's
batch: the step finishes without it and trains its group's survivors; a group left with fewer than 2 is
dropped; both are counted in the STEP record and survive a checkpoint. (Before, the step waited forever.)"""

from __future__ import annotations

from controlplane.core import loop as lp
from controlplane.core.state import Role
from controlplane.core.telemetry import RecordKind


def _loop(batch: int, group: int) -> tuple[lp.RolloutLoop, list[lp.Command]]:
    loop = lp.RolloutLoop(lp.LoopConfig(batch_size=batch, group_size=group, max_staleness=1))
    out = loop.handle(lp.Start(0.0)) + loop.handle(lp.WorkerReady(0.0, 0, Role.COLOCATED))
    return loop, out


def _finish(loop: lp.RolloutLoop, tid: str, now: float, reward: float = 1.0) -> list[lp.Command]:
    out = loop.handle(lp.TrajectoryStarted(now, tid, prompt_tokens=5))
    out += loop.handle(lp.TurnGenerated(now + 0.1, tid, 0, 3))
    return out + loop.handle(lp.EnvStepped(now + 0.2, tid, 0.1, True, reward))


def _give_up(loop: lp.RolloutLoop, tid: str, now: float) -> list[lp.Command]:
    return loop.handle(lp.EnvStepped(now, tid, 0.0, True, failed="the agent exited with status 2", final=True))


def _of(cmds: list[lp.Command], kind: type) -> list:
    return [c for c in cmds if type(c) is kind]


def test_a_given_up_member_leaves_the_batch_and_its_group_trains_smaller_or_is_dropped() -> None:
    loop, out = _loop(6, 3)  # groups: t0 t1 t2 | t3 t4 t5
    out += _give_up(loop, "s0-t0", 1.0)  # group 0 keeps t1, t2: trained
    out += _give_up(loop, "s0-t3", 1.1)  # group 1 keeps t5 only: dropped
    out += _give_up(loop, "s0-t4", 1.2)
    aborts = _of(out, lp.Abort)
    assert [(a.trajectory, a.replacement) for a in aborts] == [("s0-t0", None), ("s0-t3", None), ("s0-t4", None)]
    assert "status 2" in aborts[0].reason
    assert loop.remaining == 3 and not _of(out, lp.Train)
    for i, tid in enumerate(("s0-t1", "s0-t2", "s0-t5")):
        out += _finish(loop, tid, 2.0 + i, reward=float(i))
    out += loop.handle(lp.ReturnConfirmed(6.0))  # no borrowed worker: the update may start
    (train,) = _of(out, lp.Train)
    assert train.groups == (("s0-t1", "s0-t2"),) and train.dropped == ("s0-t5",)
    (step,) = [c.record for c in _of(out, lp.Telemetry) if c.record.kind is RecordKind.STEP]
    assert step.given_up == 3 and step.dropped_groups == 1 and step.batch_size == 6
    assert step.reward_mean == 0.5  # of the trained members (0 and 1), not the dropped one's 2
    assert loop.failed_trajectories == 3 and loop.stale_aborted == 0
    assert _of(out, lp.StartStep)[-1].step == 1  # the next step started: nothing stalls
    # the counts and the dropped list survive a driver restart
    again = lp.RolloutLoop.restore(loop.cfg, loop.checkpoint())
    s0 = again.steps[0]
    assert (s0.given_up, s0.dropped_groups, s0.dropped) == (3, 1, ["s0-t5"])
    assert again._train_command().dropped == ("s0-t5",)


def test_a_step_whose_every_member_gave_up_publishes_no_weights_and_the_job_goes_on() -> None:
    """No batch, no update: no Train, no new version (one version per trained step); the step counts as done
    for the staleness bound, so the next steps start, take v0's data as fresh and publish v1."""
    loop, out = _loop(2, 2)  # max staleness 1
    out += _give_up(loop, "s0-t0", 1.0) + _give_up(loop, "s0-t1", 1.1)
    assert not _of(out, lp.Train) and not _of(out, lp.PublishWeights) and not _of(out, lp.ReturnOverlap)
    (step,) = [c.record for c in _of(out, lp.Telemetry) if c.record.kind is RecordKind.STEP]
    assert step.given_up == 2 and step.dropped_groups == 1 and step.reward_mean == 0.0
    assert loop.version == 0 and loop.trained_next == 1 and loop.skipped == [0]
    assert _of(out, lp.StartStep)[-1].step == 1 and loop.trajs.keys() == {"s1-t0", "s1-t1"}
    # v0 is the newest weights: step 1 may use it (and step 2 could, one step behind)
    assert loop.min_weight_version(loop.trajs["s1-t0"]) == 0
    again = lp.RolloutLoop.restore(loop.cfg, loop.checkpoint())  # the skip survives a driver restart
    assert again.skipped == [0] and again.trained_next == 1
    out = _finish(loop, "s1-t0", 2.0, reward=1.0) + _finish(loop, "s1-t1", 2.5, reward=0.0)
    assert not _of(out, lp.Abort)  # not stale: v0 stands for step 0 and the skipped step
    out += loop.handle(lp.ReturnConfirmed(3.0))
    (train,) = _of(out, lp.Train)
    assert train.step == 1 and train.groups == (("s1-t0", "s1-t1"),)
    out = loop.handle(lp.TrainingDone(4.0, 1))
    assert _of(out, lp.PublishWeights) == [lp.PublishWeights(1)]  # the trainer's first update is v1
    out = loop.handle(lp.WeightsPublished(4.5, 1))
    assert loop.version == 1 and loop.trained_next == 2 and str(loop.trainer) == "idle"
    (rec,) = [c.record for c in _of(out, lp.Telemetry) if c.record.kind is RecordKind.TRAIN]
    assert rec.step == 1 and rec.weight_version == 1
    assert loop.min_weight_version(loop.trajs["s2-t0"]) == 0  # step 2 started meanwhile; v0 is one step behind


def test_with_no_staleness_a_skipped_step_keeps_the_newest_weights_fresh() -> None:
    loop = lp.RolloutLoop(lp.LoopConfig(batch_size=2, group_size=2, max_staleness=0))
    loop.handle(lp.Start(0.0))
    loop.handle(lp.WorkerReady(0.0, 0, Role.COLOCATED))
    out = _give_up(loop, "s0-t0", 1.0) + _give_up(loop, "s0-t1", 1.1)
    assert _of(out, lp.StartStep)[-1].step == 1 and loop.min_weight_version(loop.trajs["s1-t0"]) == 0
    out = _finish(loop, "s1-t0", 2.0) + _finish(loop, "s1-t1", 2.5)
    assert not _of(out, lp.Abort) and loop.steps[1].stale_aborted == 0


def test_groups_of_one_member_are_kept_and_a_lost_one_is_counted() -> None:
    loop, out = _loop(3, 1)
    out += _give_up(loop, "s0-t1", 1.0)
    out += _finish(loop, "s0-t0", 2.0) + _finish(loop, "s0-t2", 3.0) + loop.handle(lp.ReturnConfirmed(4.0))
    (train,) = _of(out, lp.Train)
    assert train.groups == (("s0-t0",), ("s0-t2",)) and train.dropped == ()
    (step,) = [c.record for c in _of(out, lp.Telemetry) if c.record.kind is RecordKind.STEP]
    assert step.given_up == 1 and step.dropped_groups == 1


def test_a_failure_that_is_not_final_is_still_restarted_on_its_task() -> None:
    loop, out = _loop(2, 2)
    out += loop.handle(lp.EnvStepped(1.0, "s0-t0", 0.0, True, failed="crashed"))
    (abort,) = _of(out, lp.Abort)
    assert abort.replacement is not None and abort.replacement.trajectory == "s0-t0-r1"
    assert loop.remaining == 2 and loop.steps[0].given_up == 0
