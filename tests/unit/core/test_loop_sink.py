"""The typed command sink (core.loop.sink): every command kind reaches the one method of its kind, and
both loop drivers have a method for every kind (mypy says so too, where it is installed)."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
import textwrap
import typing
from pathlib import Path

import pytest

from controlplane.core import loop as lp
from controlplane.core import telemetry as tm
from controlplane.core.context import Signal
from controlplane.core.state import Role

ROOT = Path(__file__).resolve().parents[3]
SINK_METHODS = sorted(n for n in vars(lp.CommandSink) if not n.startswith("_"))


def _method_of(kind: type) -> str:
    """RouteTurn -> route_turn: the sink's method for a command kind."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", kind.__name__).lower()


ONE_OF_EACH: list[lp.Command] = [
    lp.StartStep(0, 0, (lp.TrajectoryRef("s0-t0", 0, 0),)),
    lp.RouteTurn("s0-t0", 1, 0, 0),
    lp.Resubmit("s0-t0", 1, 0, 5, 0),
    lp.RouteDecode("s0-t0", 2, 1, 0),
    lp.Abort("s0-t0", "stale", lp.TrajectoryRef("s0-t0-r1", 0, 0)),
    lp.EmitSignal(Signal.STEP_START, 4),
    lp.ReturnOverlap(30.0, (3,)),
    lp.Train(0, 0, (("s0-t0",),)),
    lp.PublishWeights(1),
    lp.Telemetry(
        tm.turn(
            time_s=1.0,
            job="j",
            step=0,
            trajectory="s0-t0",
            turn=0,
            new_prompt_tokens=3,
            generated_tokens=4,
            env_time_s=0.5,
        )
    ),
    lp.Progress(0, 3, 4),
]


class Recorder:
    """A sink that writes down which method got which command."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, lp.Command]] = []

    def __getattr__(self, name: str) -> typing.Callable[[lp.Command], None]:
        if name not in SINK_METHODS:
            raise AttributeError(name)
        return lambda cmd: self.calls.append((name, cmd))


def test_one_of_each_command_kind_is_listed() -> None:
    assert sorted(type(c).__name__ for c in ONE_OF_EACH) == sorted(k.__name__ for k in typing.get_args(lp.Command))


def test_every_command_reaches_the_method_of_its_kind_only() -> None:
    assert sorted(_method_of(k) for k in typing.get_args(lp.Command)) == SINK_METHODS
    for cmd in ONE_OF_EACH:
        sink = Recorder()
        lp.dispatch(cmd, sink)  # the recorder answers every method by name (__getattr__)
        assert sink.calls == [(_method_of(type(cmd)), cmd)]


def test_a_value_outside_the_union_is_refused() -> None:
    with pytest.raises(AssertionError):
        lp.dispatch(lp.Tick(0.0), Recorder())  # type: ignore[arg-type]  # an event is no command


def test_the_feeder_carries_the_loops_commands_out_through_the_sink() -> None:
    sink = Recorder()
    loop = lp.RolloutLoop(lp.LoopConfig(batch_size=2))
    feeder = lp.Feeder(loop, lp.Dispatcher(sink))
    feeder.feed(lp.WorkerReady(0.0, 1, Role.COLOCATED))
    feeder.feed(lp.Start(0.0))
    assert [name for name, _ in sink.calls] == ["emit_signal", "start_step", "progress"]
    feeder.feed(lp.TrajectoryStarted(0.1, "s0-t0", prompt_tokens=5))
    assert sink.calls[-1] == ("route_turn", lp.RouteTurn("s0-t0", 1, 0, 0))


def test_a_dispatcher_deep_copies_with_its_sink() -> None:
    """The oracle forks a simulation with copy.deepcopy: the fork's commands must reach the fork's sink."""
    sink = Recorder()
    fork = copy.deepcopy(lp.Dispatcher(sink))
    fork(lp.PublishWeights(2))
    assert sink.calls == [] and typing.cast(Recorder, fork.sink).calls == [("publish_weights", lp.PublishWeights(2))]


def _drivers() -> list[type]:
    from agents.driver import RolloutDriver
    from controlplane.sim.cluster import SimCommands

    return [RolloutDriver, SimCommands]


@pytest.mark.parametrize("driver", _drivers(), ids=lambda d: d.__module__)
def test_both_drivers_have_a_method_for_every_command_kind(driver: type) -> None:
    missing = [m for m in SINK_METHODS if not callable(getattr(driver, m, None))]
    assert missing == []


def test_mypy_finds_a_driver_that_lacks_a_handler(tmp_path: Path) -> None:
    """A sink with every method passes; the same sink without `abort` is a type error, naming it."""
    pytest.importorskip("mypy")
    every = "\n".join(
        f"    def {m}(self, cmd: lp.{k.__name__}) -> None: ..."
        for k in typing.get_args(lp.Command)
        for m in [_method_of(k)]
    )
    lacking = "\n".join(line for line in every.split("\n") if "def abort" not in line)
    (tmp_path / "sinks.py").write_text(
        textwrap.dedent("""\
        from controlplane.core import loop as lp

        class Complete:
        {every}

        class Lacking:
        {lacking}

        lp.dispatch(lp.PublishWeights(1), Complete())
        lp.dispatch(lp.PublishWeights(1), Lacking())
        """).format(every=every, lacking=lacking)
    )
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--follow-imports=silent", str(tmp_path / "sinks.py")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 1, out.stdout
    assert 'incompatible type "Lacking"; expected "CommandSink"' in out.stdout, out.stdout
    assert "Found 1 error" in out.stdout and re.search(r"note:\s+abort$", out.stdout, re.M), out.stdout
