"""The loop's work per turn and per checkpoint does not grow with the number of trajectories (issue 22):
counted in Python lines executed and records encoded, not timed; and the cached checkpoint is exactly
the full one, event after event, faults included."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from controlplane.core import loop as lp
from controlplane.core.loop import state as loop_state
from controlplane.core.state import Role

from .loop_world import Reaction, ToyWorld, run_heap

C, P, D = Role.COLOCATED, Role.PREFILL, Role.DECODE
LOOP_FILES = tuple(
    str(p)
    for p in (
        *(Path(lp.__file__).parent.glob("*.py")),
        Path(sys.modules["controlplane.core.router"].__file__ or ""),
    )
)


class Lines:
    """Python lines executed in the loop's and the router's files (loop iterations included)."""

    def __init__(self) -> None:
        self.n = 0

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            self.n += 1
        return self._local

    def _global(self, frame: FrameType, event: str, arg: Any) -> Any:
        return self._local if frame.f_code.co_filename in LOOP_FILES else None

    def __enter__(self) -> Lines:
        sys.settrace(self._global)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(None)


def _running_loop(batch: int, dispatch: str, workers: int = 4) -> tuple[lp.RolloutLoop, list[str]]:
    """A loop whose first step is in flight: every trajectory started and its first turn routed."""
    loop = lp.RolloutLoop(lp.LoopConfig(batch_size=batch, group_size=16, dispatch=dispatch, dispatch_cap=0))
    loop.handle(lp.Start(0.0))
    for w in range(workers):
        loop.handle(lp.WorkerReady(0.0, w, C))
    tids = list(loop.trajs)
    for tid in tids:
        loop.handle(lp.TrajectoryStarted(0.1, tid, prompt_tokens=64))
    return loop, tids


def _turns(loop: lp.RolloutLoop, tids: list[str], n: int, t0: float) -> None:
    """`n` turns, one each on the first `n` trajectories: generated on their worker, the environment steps."""
    for i, tid in enumerate(tids[:n]):
        now = t0 + i * 1e-3
        loop.handle(lp.TurnGenerated(now, tid, loop.trajs[tid].worker or 0, 16, prefilled_tokens=16))
        loop.handle(lp.EnvStepped(now, tid, 0.0, False, observation_tokens=16))


@pytest.mark.parametrize("dispatch", ["sticky", "jsq"])
def test_a_turn_executes_the_same_lines_with_64_and_1024_trajectories(dispatch: str) -> None:
    counts = {}
    for batch in (64, 1024):
        loop, tids = _running_loop(batch, dispatch)
        with Lines() as lines:
            _turns(loop, tids, 64, 1.0)
        counts[batch] = lines.n / 64
    # the same turns on the same workers: any pass over every trajectory would show 16× here
    assert counts[1024] <= counts[64] * 1.02, counts
    assert counts[64] > 20  # the count sees the loop's work at all


def test_a_checkpoint_encodes_only_the_trajectories_that_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    encoded = [0]
    real = loop_state.traj_json

    def counting(t: lp.Traj) -> dict[str, Any]:
        encoded[0] += 1
        return real(t)

    monkeypatch.setattr(loop_state, "traj_json", counting)
    lines = {}
    for batch in (64, 1024):
        loop, tids = _running_loop(batch, "sticky")
        first = loop.checkpoint()
        assert len(first["trajectories"]) == batch
        encoded[0] = 0
        _turns(loop, tids, 40, 1.0)
        with Lines() as counted:
            second = loop.checkpoint()
        assert encoded[0] == 40, (batch, encoded[0])  # the 40 that took a turn, whatever B·G is
        lines[batch] = counted.n
        assert second == loop_state.encode(loop, cached=False)
        assert first != second and json.loads(json.dumps(first))["trajectories"][0]["turn"] == 0  # kept as it was
    assert lines[1024] == lines[64], lines


SCENARIOS = {  # world, preemptions (time, worker), dispatch, until (the stale one restarts ever more trajectories)
    "colocated, preempted": (dict(workers={0: C, 1: C, 2: C}, overlap={10: C}), [(4.0, 1), (9.0, 2)], "sticky", 60.0),
    "disaggregated, stale engine": (dict(workers={0: P, 1: D, 2: D}, stale_engine=2), [(6.0, 1)], "sticky", 16.0),
    "jsq with a cap, preempted": (dict(workers={0: C, 1: C}, overlap={10: C}), [(5.0, 1)], "jsq", 60.0),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
@pytest.mark.parametrize("every", [1, 7])
def test_the_cached_checkpoint_and_jsq_load_are_the_full_ones_after_every_event(
    name: str, every: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    world_kw, preempt, dispatch, until = SCENARIOS[name]
    world = ToyWorld(**world_kw, train_s=2.0, return_s=0.3)  # type: ignore[arg-type]
    script: list[tuple[float, Callable[[float], list[Reaction]]]] = [
        (t, partial(world.take_away, w, why="preempt")) for t, w in preempt
    ]
    config = lp.LoopConfig(
        batch_size=12,
        group_size=3,
        max_staleness=1,
        return_deadline_s=5.0,
        dispatch=dispatch,
        dispatch_cap=2 if dispatch == "jsq" else 0,
    )
    handle = lp.RolloutLoop.handle
    seen = {"events": 0, "checks": 0}
    kept: list[tuple[dict[str, Any], str]] = []

    def checked(self: lp.RolloutLoop, ev: lp.Event) -> list[lp.Command]:
        out = handle(self, ev)
        seen["events"] += 1
        load: dict[int, int] = {}
        for t in self.trajs.values():  # the pass _first_load used to make every turn
            if t.state is lp.TrajState.FIRST and t.worker is not None:
                load[t.worker] = load.get(t.worker, 0) + 1
        assert self._first_load() == load
        if seen["events"] % every == 0:
            snap = self.checkpoint()
            assert snap == loop_state.encode(self, cached=False)
            kept.append((snap, json.dumps(snap)))
            seen["checks"] += 1
            if seen["checks"] % 25 == 0:  # a restored loop's checkpoint is the same too
                back = lp.RolloutLoop.restore(self.cfg, json.loads(json.dumps(snap)))
                assert back.checkpoint() == snap
        return out

    monkeypatch.setattr(lp.RolloutLoop, "handle", checked)
    loop, cmds = run_heap(world, config, script, until=until)
    assert loop.trained_next >= 2 and seen["checks"] > 20
    assert any(type(c) is lp.Abort for _, c in cmds) or "stale" not in name  # restarts are covered
    # a checkpoint handed out earlier is never changed by the cache afterwards
    assert all(json.dumps(snap) == text for snap, text in kept)
