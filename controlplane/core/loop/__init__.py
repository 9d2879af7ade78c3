"""The asynchronous RL loop as a pure state machine: events in, commands out (docs/design.md §10).

One rollout/training loop for one job, with no I/O and no clock of its own: every event carries
the time it happened, and `handle(event)` returns the commands the driver must carry out (the
etcd/raft `Ready` pattern). Two drivers run it: the simulator (`controlplane.sim`, virtual time)
and the live rollout driver (`agents.driver`, asyncio). What it owns:

- the step cycle: start batch j of B trajectories (GRPO groups of `group_size`) once the weights
  are at most `max_staleness` versions behind it; when the last trajectory of a batch finishes,
  hand the batch to the trainer in order: Training Begin → return every borrowed overlap worker
  (with a deadline) → train only after the return is confirmed → publish weights → Training
  Finished (or straight into the next update if the next batch is already collected);
- routing every turn through the PD router (`core.router`), keeping interrupted trajectories'
  partial progress and resubmitting them, queueing turns while nothing can serve them;
- the staleness bound: a trajectory whose data comes from weights older than
  `step − max_staleness` is aborted, counted and restarted on the same task;
- failed environments (external agents): a failed trajectory is restarted on its task; a *final* failure
  (its member out of attempts) leaves the batch instead, and its step trains the group's surviving members
  (a group left with fewer than 2 is dropped; both counted in the STEP record), so no step waits for it;
- the progress figure R, the elastic signals, and the TURN / STEP / TRAIN telemetry records.

What happens to a command is the driver's business (the simulator's world, or real engines,
environments and the control plane); what happened comes back as an event.

The package, by idea: `messages` (the events and commands), `state` (the loop's records and their
checkpoint codec), `base` (`LoopConfig`; `LoopBase`: the loop's records, admitting a step), `training` (the trainer
handshake), `routing` (workers and routing), `machine` (`RolloutLoop`: the entry point, the trajectories' events),
`feeder` (`Feeder`: how a driver feeds it), `sink` (`CommandSink`, `dispatch`: how a driver carries every kind of
command out, checked by the type checker).
"""

from __future__ import annotations

from controlplane.core.loop.base import MAX_STALENESS, LoopConfig
from controlplane.core.loop.feeder import Feeder
from controlplane.core.loop.machine import RolloutLoop
from controlplane.core.loop.messages import (
    Abort,
    Admission,
    Command,
    Decided,
    EmitSignal,
    EnvStepped,
    Event,
    Prefilled,
    Progress,
    PublishWeights,
    Resubmit,
    ReturnConfirmed,
    ReturnOverlap,
    RouteDecode,
    RouteTurn,
    Start,
    StartStep,
    Stop,
    Telemetry,
    Tick,
    Train,
    TrainingDone,
    TrajectoryRecovered,
    TrajectoryRef,
    TrajectoryStarted,
    TurnGenerated,
    TurnInterrupted,
    WeightsPublished,
    WorkerGone,
    WorkerReady,
)
from controlplane.core.loop.sink import CommandSink, Dispatcher, dispatch
from controlplane.core.loop.state import StepState, Traj, TrajState

__all__ = [
    "MAX_STALENESS",
    "Abort",
    "Admission",
    "Command",
    "CommandSink",
    "Decided",
    "Dispatcher",
    "EmitSignal",
    "EnvStepped",
    "Event",
    "Feeder",
    "LoopConfig",
    "Prefilled",
    "Progress",
    "PublishWeights",
    "Resubmit",
    "ReturnConfirmed",
    "ReturnOverlap",
    "RolloutLoop",
    "RouteDecode",
    "RouteTurn",
    "Start",
    "StartStep",
    "StepState",
    "Stop",
    "Telemetry",
    "Tick",
    "Train",
    "TrainingDone",
    "Traj",
    "TrajState",
    "TrajectoryRecovered",
    "TrajectoryRef",
    "TrajectoryStarted",
    "TurnGenerated",
    "TurnInterrupted",
    "WeightsPublished",
    "WorkerGone",
    "WorkerReady",
    "dispatch",
]
