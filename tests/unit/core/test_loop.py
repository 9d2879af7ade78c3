"""The RL loop as a pure state machine (core/loop/): step cycle, routing, interruptions, the
training handshake, staleness, checkpoint/restore, and the same commands on two clocks."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from functools import partial

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.core import loop as lp
from controlplane.core.context import Signal
from controlplane.core.state import Role
from controlplane.core.telemetry import RecordKind

from .loop_world import Reaction, ToyWorld, run_asyncio, run_heap

C, P, D = Role.COLOCATED, Role.PREFILL, Role.DECODE


def cfg(**kw) -> lp.LoopConfig:
    return lp.LoopConfig(**({"batch_size": 4, "group_size": 2, "max_staleness": 1, "return_deadline_s": 2.0} | kw))


def kinds(cmds, k):
    return [(t, c) for t, c in cmds if type(c) is k]


def records(cmds, kind: RecordKind):
    return [c.record for _, c in cmds if type(c) is lp.Telemetry and c.record.kind is kind]


def signals(cmds):
    return [(t, c.signal) for t, c in cmds if type(c) is lp.EmitSignal]


def test_steps_run_route_train_publish_in_order() -> None:
    world = ToyWorld({0: C, 1: C}, train_s=1.0)  # updates shorter than a rollout: a Training Finished each step
    loop, cmds = run_heap(world, cfg(), [], until=60.0)
    starts = kinds(cmds, lp.StartStep)
    assert [c.step for _, c in starts][:3] == [0, 1, 2]
    assert len(starts[0][1].trajectories) == 4 and {r.group for r in starts[0][1].trajectories} == {0, 1}
    # every first turn went to a serving colocated worker; sticky per trajectory
    homes = defaultdict(set)
    for _, c in kinds(cmds, lp.RouteTurn):
        homes[c.trajectory].add(c.worker)
    assert all(len(ws) == 1 for ws in homes.values())
    assert {w for ws in homes.values() for w in ws} == {0, 1}  # both workers used
    # training: Training Begin -> return -> train -> publish -> Training Finished, for each step in order
    seq = [
        (type(c).__name__, getattr(c, "signal", getattr(c, "step", getattr(c, "version", None))))
        for _, c in cmds
        if type(c) in (lp.ReturnOverlap, lp.Train, lp.PublishWeights)
        or (type(c) is lp.EmitSignal and c.signal in (Signal.TRAINING_BEGIN, Signal.TRAINING_FINISHED))
    ]
    assert seq[:5] == [
        ("EmitSignal", Signal.TRAINING_BEGIN),
        ("ReturnOverlap", None),
        ("Train", 0),
        ("PublishWeights", 1),
        ("EmitSignal", Signal.TRAINING_FINISHED),
    ]
    trains = kinds(cmds, lp.Train)
    assert [c.step for _, c in trains] == list(range(len(trains))) and len(trains) >= 2
    assert all(sorted(len(g) for g in c.groups) == [2, 2] for _, c in trains)
    # async with staleness 1: step 1 starts as soon as step 0 is collected, before v1 is published
    t_start1 = starts[1][0]
    t_pub1 = next(t for t, c in kinds(cmds, lp.PublishWeights) if c.version == 1)
    assert t_start1 < t_pub1
    assert loop.version >= 2
    # per-step figures
    step0 = records(cmds, RecordKind.STEP)[0]
    assert step0.batch_size == 4 and step0.makespan_s > 0 and step0.generated_tokens_total > 0
    assert step0.train_tokens == step0.generated_tokens_total + sum(
        50 + 30 * (world._task_turns(f"s0-t{i}") - 1) for i in range(4)
    )
    train0 = records(cmds, RecordKind.TRAIN)[0]
    assert train0.weight_version == 1 and train0.duration_s >= world.train_s and train0.return_latency_s > 0


def test_disaggregated_turns_go_prefill_then_decode_shortest_queue() -> None:
    world = ToyWorld({0: P, 1: D, 2: D})
    _loop, cmds = run_heap(world, cfg(batch_size=6, group_size=3), [], until=20.0)
    firsts = kinds(cmds, lp.RouteTurn)
    decodes = kinds(cmds, lp.RouteDecode)
    assert firsts and all(c.worker == 0 for _, c in firsts)
    assert decodes and all(c.source == 0 and c.worker in (1, 2) for _, c in decodes)
    assert {c.worker for _, c in decodes} == {1, 2}  # join-shortest-queue spreads them


def test_an_interrupted_turn_resumes_elsewhere_with_its_prefix_and_nothing_twice() -> None:
    world = ToyWorld({0: C, 1: C})
    script = [(0.5, lambda now: world.take_away(0, now, "preempt"))]  # mid-generation of the first turns
    _loop, cmds = run_heap(world, cfg(), script, until=40.0)
    resub = kinds(cmds, lp.Resubmit)
    assert resub and all(c.worker == 1 and c.kept_tokens > 0 for _, c in resub)
    # the trained samples have exactly their turns' tokens: the kept prefix was not generated twice
    step0 = records(cmds, RecordKind.STEP)[0]
    expected = sum(world._tokens(f"s0-t{i}", k) for i in range(4) for k in range(world._task_turns(f"s0-t{i}")))
    assert step0.generated_tokens_total == expected
    assert step0.interruptions == len(resub)


def test_borrowed_workers_go_back_before_every_update_and_get_no_turns_meanwhile() -> None:
    world = ToyWorld({0: C}, overlap={10: C, 11: C}, train_s=0.5, turns=6)
    loop, cmds = run_heap(world, cfg(batch_size=8, group_size=4, periodic_s=None), [], until=80.0)
    assert any(c.worker in (10, 11) for _, c in kinds(cmds, lp.RouteTurn))  # borrowed and used
    training = False
    returned = set()
    for _, c in cmds:
        if type(c) is lp.EmitSignal and c.signal is Signal.TRAINING_BEGIN:
            training = True
        elif type(c) is lp.EmitSignal and c.signal is Signal.TRAINING_FINISHED:
            training = False
        elif type(c) is lp.ReturnOverlap:
            returned |= set(c.workers)
        elif type(c) in (lp.RouteTurn, lp.Resubmit, lp.RouteDecode) and training:
            assert c.worker not in (10, 11), "a training GPU got a turn while the trainer owned it"
    assert returned == {10, 11}
    assert loop.deadline_misses == 0
    borrowed = [r.borrowed_gpu_s for r in records(cmds, RecordKind.STEP)]
    assert any(b > 0 for b in borrowed)


def test_a_late_return_is_a_deadline_miss() -> None:
    world = ToyWorld({0: C}, overlap={10: C}, return_s=5.0)
    loop, cmds = run_heap(world, cfg(return_deadline_s=1.0), [], until=60.0)
    assert loop.deadline_misses >= 1
    assert any(r.return_latency_s > 1.0 for r in records(cmds, RecordKind.TRAIN))


def test_data_from_too_old_weights_is_aborted_counted_and_replaced() -> None:
    world = ToyWorld({0: C, 1: C}, stale_engine=1)  # worker 1 keeps serving weights v0
    loop, cmds = run_heap(world, cfg(max_staleness=1), [], until=120.0)
    aborts = kinds(cmds, lp.Abort)
    assert aborts and all(c.replacement is not None and c.reason.startswith("stale") for _, c in aborts)
    assert all(int(c.trajectory.split("-")[0][1:]) >= 2 for _, c in aborts)  # only steps 2+ are > 1 version behind
    assert sum(r.stale_aborted for r in records(cmds, RecordKind.STEP)) == loop.stale_aborted > 0
    trained = {tid for _, c in kinds(cmds, lp.Train) for g in c.groups for tid in g}
    assert not trained & {c.trajectory for _, c in aborts}


def test_checkpoint_restore_finishes_the_step_with_the_same_accounting() -> None:
    world = ToyWorld({0: C, 1: C})
    loop, _cmds = run_heap(world, cfg(batch_size=8, group_size=4), [], until=3.0)
    assert loop.rollout_active and 0 < loop.remaining < 8
    done_before = {t.tid for t in loop.trajs.values() if t.state is lp.TrajState.DONE}
    snap = json.loads(json.dumps(loop.checkpoint()))  # JSON on the wire
    back = lp.RolloutLoop.restore(loop.cfg, snap)
    assert (back.step, back.version, back.remaining) == (loop.step, loop.version, loop.remaining)
    out = back.handle(lp.Start(10.0))
    aborted = [c for c in out if type(c) is lp.Abort]
    assert {c.trajectory for c in aborted} == {
        t.tid for t in loop.trajs.values() if t.step == loop.step and t.state is not lp.TrajState.DONE
    }
    assert all(c.replacement is not None for c in aborted)
    assert back.remaining == loop.remaining  # restarts keep R
    assert done_before <= {t.tid for t in back.trajs.values() if t.state is lp.TrajState.DONE}


def test_periodic_signal_only_while_a_batch_is_in_flight() -> None:
    loop = lp.RolloutLoop(cfg(periodic_s=10.0))
    loop.handle(lp.Start(0.0))
    assert [c for c in loop.handle(lp.Tick(5.0)) if type(c) is lp.EmitSignal] == []
    assert [c.signal for c in loop.handle(lp.Tick(10.0)) if type(c) is lp.EmitSignal] == [Signal.PERIODIC]


@pytest.mark.looptime
async def test_the_same_events_give_the_same_commands_on_the_heap_and_on_asyncio() -> None:
    def make_world():
        return ToyWorld({0: C, 1: C, 2: C}, overlap={10: C})

    def script(world):
        return [(1.3, lambda now: world.take_away(2, now, "preempt"))]

    w1 = make_world()
    _, heap_cmds = run_heap(w1, cfg(batch_size=6, group_size=3, periodic_s=7.0), script(w1), until=45.0)
    w2 = make_world()
    _, aio_cmds = await run_asyncio(w2, cfg(batch_size=6, group_size=3, periodic_s=7.0), script(w2), until=45.0)
    assert len(heap_cmds) > 200
    assert aio_cmds == heap_cmds


# ============================================================================ properties
roles = st.sampled_from(["coloc", "pd"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    mode=roles,
    n=st.integers(2, 4),
    n_overlap=st.integers(0, 2),
    preempt=st.lists(st.tuples(st.floats(0.1, 30.0), st.integers(0, 3)), max_size=3),
    stale=st.booleans(),
    alpha=st.integers(0, 2),
    train_s=st.floats(0.5, 8.0),
    ret_s=st.floats(0.1, 3.0),
)
def test_no_trajectory_lost_or_twice_returns_before_training_staleness_and_R(
    mode, n, n_overlap, preempt, stale, alpha, train_s, ret_s
) -> None:
    if mode == "coloc":
        workers = {i: C for i in range(n)}
    else:
        workers = {0: P, **{i: D for i in range(1, n)}}
    overlap = {10 + i: (C if mode == "coloc" else D) for i in range(n_overlap)}
    world = ToyWorld(workers, overlap=overlap, train_s=train_s, return_s=ret_s, stale_engine=(n - 1) if stale else None)
    # preempt at most n-1 dedicated workers (the first one stays, or nothing could serve)
    script: list[tuple[float, Callable[[float], list[Reaction]]]] = [
        (t, partial(world.take_away, w, why="preempt")) for t, w in preempt if 0 < w < n
    ]
    config = cfg(batch_size=6, group_size=3, max_staleness=alpha, return_deadline_s=10.0, periodic_s=5.0)
    loop, cmds = run_heap(world, config, script, until=90.0)

    # R never rises within a step
    last: dict[int, int] = {}
    for _, c in kinds(cmds, lp.Progress):
        assert c.remaining <= last.get(c.step, c.batch_size)
        last[c.step] = c.remaining
    # every trajectory trained at most once, each step's batch trained whole, groups of group_size
    trained: list[str] = []
    for _, c in kinds(cmds, lp.Train):
        assert sorted(len(g) for g in c.groups) == [3, 3]
        trained += [tid for g in c.groups for tid in g]
    assert len(trained) == len(set(trained))
    aborted = {c.trajectory for _, c in kinds(cmds, lp.Abort)}
    assert not set(trained) & aborted
    # accounting: started = finished + aborted + in flight
    in_flight = sum(1 for t in loop.trajs.values() if t.state not in (lp.TrajState.DONE, lp.TrajState.ABORTED))
    assert loop.started_trajectories == loop.finished_trajectories + loop.stale_aborted + in_flight
    # borrowed workers are returned (and confirmed) before every update; none serves while training
    training, confirmed_since_tb = False, True
    for _, c in cmds:
        if type(c) is lp.EmitSignal and c.signal is Signal.TRAINING_BEGIN:
            training, confirmed_since_tb = True, False
        elif type(c) is lp.ReturnOverlap:
            confirmed_since_tb = True
        elif type(c) is lp.Train:
            assert training and confirmed_since_tb
        elif type(c) is lp.EmitSignal and c.signal is Signal.TRAINING_FINISHED:
            training = False
        elif type(c) in (lp.RouteTurn, lp.Resubmit, lp.RouteDecode) and training:
            assert c.worker not in overlap
    # staleness: no trained trajectory has a turn generated by the stale engine (weights v0) beyond alpha
    if stale:
        for tid in trained:
            if int(tid.split("-")[0][1:]) > alpha:
                assert (n - 1) not in world.generated_by[tid], tid
    # every trained trajectory's generated tokens are exactly its turns' tokens (no token twice)
    per_traj: dict[str, int] = defaultdict(int)
    for r in records(cmds, RecordKind.TURN):
        per_traj[r.trajectory] += r.generated_tokens
    for tid in trained:
        assert per_traj[tid] == sum(world._tokens(tid, k) for k in range(world._task_turns(tid))), tid


def test_jsq_dispatch_holds_turns_while_every_worker_is_at_its_cap_and_loses_none() -> None:
    """RLBoost's Algorithm 2 (the RLBoost+ baseline): join-shortest-queue on turns in flight, delayed
    dispatch at the cap; held turns go out as turns finish, and the batch still completes exactly."""
    world = ToyWorld({0: C, 1: C}, train_s=1.0)
    react = world.react
    peak: defaultdict[int, int] = defaultdict(int)

    def watched(cmd: lp.Command, now: float) -> list[Reaction]:
        # the world's own books: turns in flight on each worker, never above the cap
        out = react(cmd, now)
        for r in world.inflight.values():
            peak[r.worker] = max(peak[r.worker], sum(1 for q in world.inflight.values() if q.worker == r.worker))
        return out

    world.react = watched  # type: ignore[method-assign]  # the test watches the world's own reactions
    _loop, cmds = run_heap(world, cfg(batch_size=8, group_size=4, dispatch="jsq", dispatch_cap=2), [], until=60.0)
    assert peak and max(peak.values()) == 2
    trains = kinds(cmds, lp.Train)
    assert len(trains) >= 2 and all(sum(len(g) for g in c.groups) == 8 for _, c in trains)
    step0 = records(cmds, RecordKind.STEP)[0]
    expected = sum(world._tokens(f"s0-t{i}", k) for i in range(8) for k in range(world._task_turns(f"s0-t{i}")))
    assert step0.generated_tokens_total == expected
    # without the cap the same batch puts 4 turns on each worker at once: the cap is what held them
    _, free = run_heap(
        ToyWorld({0: C, 1: C}, train_s=1.0), cfg(batch_size=8, group_size=4, dispatch="jsq"), [], until=1.0
    )
    assert max(sum(1 for _, c in kinds(free, lp.RouteTurn) if c.worker == w and c.turn == 0) for w in (0, 1)) == 4


def test_jsq_dispatch_keeps_the_home_on_ties_and_fills_a_new_worker_first() -> None:
    from controlplane.core.router import Router

    r = Router()
    r.add(0, C)
    r.add(1, C)
    assert r.pick_first("a", {}, 0) == 0  # all equal: lowest id
    assert r.pick_first("a", {0: 1, 1: 1}, 0) == 0  # tie: stays home (its prefix cache)
    assert r.pick_first("a", {0: 2, 1: 1}, 0) == 1  # home busier: shortest queue wins
    r.add(2, C)  # a worker joins idle
    assert r.pick_first("b", {0: 1, 1: 1}, 0) == 2
    assert r.pick_first("c", {0: 3, 1: 3, 2: 3}, 3) is None  # every worker at the cap: held
    with pytest.raises(ValueError):
        lp.LoopConfig(batch_size=4, dispatch="random")


def test_a_long_run_keeps_a_bounded_window_of_step_records_and_its_checkpoint_restores() -> None:
    """A final step's record (its B·G trajectory ids) is not kept forever: the loop and its checkpoint hold
    the last STEP_RECORDS_KEPT of them, so a checkpoint's size does not grow with the steps trained."""
    from controlplane.core.loop.state import encode
    from controlplane.core.loop.training import STEP_RECORDS_KEPT

    world = ToyWorld({0: C, 1: C}, train_s=1.0)
    loop, cmds = run_heap(world, cfg(), [], until=400.0)
    trained = len(kinds(cmds, lp.Train))
    assert trained > STEP_RECORDS_KEPT + 10  # long enough for the window to matter
    snap = json.loads(json.dumps(loop.checkpoint()))
    kept = [s["step"] for s in snap["steps"]]
    assert len(kept) <= STEP_RECORDS_KEPT + 2 and kept[-1] == loop.step  # the newest, not the oldest
    assert snap == json.loads(json.dumps(encode(loop, cached=False)))  # the cache forgot them too
    back = lp.RolloutLoop.restore(loop.cfg, snap)
    assert (back.step, back.version, back.remaining) == (loop.step, loop.version, loop.remaining)
