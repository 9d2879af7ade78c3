"""The typed command sink: each kind of loop command has one handler in every driver.

A driver (the simulator, the live rollout driver) implements `CommandSink`, one method per command
kind, and hands the loop's commands to `dispatch`. The `match` ends in `assert_never` on the closed
`Command` union, so a command kind with no case here, or a driver with no method for one, is a type
error (mypy) instead of a `TypeError` in the middle of a run.
"""

from __future__ import annotations

from typing import Protocol, assert_never

from controlplane.core.loop.messages import (
    Abort,
    Command,
    EmitSignal,
    Progress,
    PublishWeights,
    Resubmit,
    ReturnOverlap,
    RouteDecode,
    RouteTurn,
    StartStep,
    Telemetry,
    Train,
)


class CommandSink(Protocol):
    """What a driver does with each command (the command's docstring says what the loop expects back)."""

    def start_step(self, cmd: StartStep) -> None: ...

    def route_turn(self, cmd: RouteTurn) -> None: ...

    def resubmit(self, cmd: Resubmit) -> None: ...

    def route_decode(self, cmd: RouteDecode) -> None: ...

    def abort(self, cmd: Abort) -> None: ...

    def emit_signal(self, cmd: EmitSignal) -> None: ...

    def return_overlap(self, cmd: ReturnOverlap) -> None: ...

    def train(self, cmd: Train) -> None: ...

    def publish_weights(self, cmd: PublishWeights) -> None: ...

    def telemetry(self, cmd: Telemetry) -> None: ...

    def progress(self, cmd: Progress) -> None: ...


def dispatch(cmd: Command, sink: CommandSink) -> None:
    """Carry `cmd` out through the sink's method for its kind (the frequent kinds are matched first)."""
    match cmd:
        case RouteTurn():
            sink.route_turn(cmd)
        case Telemetry():
            sink.telemetry(cmd)
        case Progress():
            sink.progress(cmd)
        case RouteDecode():
            sink.route_decode(cmd)
        case Resubmit():
            sink.resubmit(cmd)
        case StartStep():
            sink.start_step(cmd)
        case EmitSignal():
            sink.emit_signal(cmd)
        case Abort():
            sink.abort(cmd)
        case ReturnOverlap():
            sink.return_overlap(cmd)
        case Train():
            sink.train(cmd)
        case PublishWeights():
            sink.publish_weights(cmd)
        case _:
            assert_never(cmd)


class Dispatcher:
    """`dispatch` bound to one sink, as the callable `Feeder` and the live driver's clock take. A value, not a
    closure: `copy.deepcopy` copies its sink with it (the simulator's oracle forks a whole simulation)."""

    __slots__ = ("sink",)

    def __init__(self, sink: CommandSink) -> None:
        self.sink = sink

    def __call__(self, cmd: Command) -> None:
        dispatch(cmd, self.sink)
