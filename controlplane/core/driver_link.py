"""Typed JSON messages of the driver link (`/ws/driver/`): a job's rollout driver (the Pipeline
Scheduler) and the control plane (the Elastic Scheduler).

The driver reports what the RL loop knows — progress R, its elastic signals, TURN/STEP/TRAIN
telemetry, its checkpoint — and asks before the trainer computes. The control plane pushes what the
driver must route by: the job's serving workers (role, endpoint), the published weight version,
whether Training Begin's return of the borrowed workers is complete. Level-triggered: every push
carries the full view; a reconnecting driver gets the current one in `welcome`.

Written and read by the one wire codec (`core/wire`, this link's `DRIVER_LINK`):
`DRIVER_LINK.parse(data, DRIVER_MESSAGES)` (or `CONTROL_MESSAGES`) is strict (unknown types or fields,
wrong types, out-of-range values raise `WireError` naming the field).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from controlplane.core.context import Signal
from controlplane.core.state import Role
from controlplane.core.wire import ErrorReply, WireProtocol, bounded

MAX_RECORDS = 2048
MAX_WORKERS = 65536
MAX_CHECKPOINT_BYTES = 8 << 20
# what a trajectory report keeps of one agent trajectory (issue 19): the job page's browser, not the trainer's
# copy (that goes to the trainer whole); longer token lists are cut here and marked `truncated`
MAX_TRAJECTORY_TOKENS = 4096
MAX_TRAJECTORY_TURNS = 256
MAX_TRAJECTORY_MESSAGES = 64
MAX_MESSAGE_CHARS = 4000
MAX_TRAJECTORIES = 256  # per report (the driver also keeps each report's frame under MAX_REPORT_BYTES)
MAX_REPORT_BYTES = 768 << 10
TRAJECTORY_STATUSES = ("running", "done", "failed", "aborted")


# ---------------------------------------------------------------- driver -> control plane
@dataclass(frozen=True, slots=True)
class Hello:
    type: ClassVar[str] = "hello"
    job: str = field(metadata=bounded(max_len=63))
    incarnation: str = field(metadata=bounded(max_len=64))  # new per driver process start


@dataclass(frozen=True, slots=True)
class ProgressReport:
    type: ClassVar[str] = "progress"
    step: int = field(metadata=bounded(0, 2**31))
    remaining: int = field(metadata=bounded(0, 2**31))


@dataclass(frozen=True, slots=True)
class SignalReport:
    type: ClassVar[str] = "signal"
    signal: Signal
    remaining: int = field(metadata=bounded(0, 2**31))


@dataclass(frozen=True, slots=True)
class TelemetryReport:
    type: ClassVar[str] = "telemetry"
    records: list[dict[str, Any]] = field(metadata=bounded(max_len=MAX_RECORDS))


@dataclass(frozen=True, slots=True)
class CheckpointReport:
    type: ClassVar[str] = "checkpoint"
    state: dict[str, Any]


@dataclass(frozen=True, slots=True)
class TrajectorySummary:
    """One agent trajectory as the job page shows it: its chat, its tokens with the loss mask (1 = sampled by
    the policy) and per-token log-probs, and per turn the weight version, the worker and the latency."""

    name: str = field(metadata=bounded(max_len=128))  # the loop's trajectory id
    status: str = field(metadata=bounded(max_len=16))  # one of TRAJECTORY_STATUSES
    reward: float | None = None
    turns: int = field(default=0, metadata=bounded(0, 1 << 20))
    forks: int = field(default=0, metadata=bounded(0, 1 << 20))
    reason: str = field(default="", metadata=bounded(max_len=MAX_MESSAGE_CHARS))
    stderr: str = field(default="", metadata=bounded(max_len=MAX_MESSAGE_CHARS))
    messages: list[dict[str, Any]] = field(default_factory=list, metadata=bounded(max_len=MAX_TRAJECTORY_MESSAGES))
    tokens: list[int] = field(default_factory=list, metadata=bounded(0, 1 << 31, max_len=MAX_TRAJECTORY_TOKENS))
    mask: list[int] = field(default_factory=list, metadata=bounded(0, 1, max_len=MAX_TRAJECTORY_TOKENS))
    logprobs: list[float] = field(default_factory=list, metadata=bounded(-1e9, 1e9, max_len=MAX_TRAJECTORY_TOKENS))
    sample_lens: list[int] = field(default_factory=list, metadata=bounded(0, 1 << 31, max_len=MAX_TRAJECTORY_TURNS))
    token_count: int = field(default=0, metadata=bounded(0, 1 << 31))  # before truncation
    truncated: bool = False
    weight_versions: list[int] = field(default_factory=list, metadata=bounded(0, 1 << 31, max_len=MAX_TRAJECTORY_TURNS))
    # per turn, every worker that served it, in order (a turn resumed on another worker lists both)
    workers: list[list[int]] = field(default_factory=list, metadata=bounded(-1, 1 << 31, max_len=MAX_TRAJECTORY_TURNS))
    latency_s: list[float] = field(default_factory=list, metadata=bounded(0.0, 1e7, max_len=MAX_TRAJECTORY_TURNS))
    # a done trajectory: trained on (true: the update that consumed it committed) or left out of its step's update
    # (false: its group was dropped, `reason` says why); null until then, and where it does not apply
    trained: bool | None = None
    rerun: bool = False  # regenerated after a crash (the trajectory of its task before was lost with its driver)
    resumed: bool = False  # continued from a kept prefix after a restart


@dataclass(frozen=True, slots=True)
class TrajectoryReport:
    """The agent trajectories of step `step` that ended since the last report (bring your own agent)."""

    type: ClassVar[str] = "trajectories"
    step: int = field(metadata=bounded(0, 2**31))
    trajectories: list[TrajectorySummary] = field(metadata=bounded(max_len=MAX_TRAJECTORIES))


@dataclass(frozen=True, slots=True)
class UpdateRequest:
    """The loop wants the trainer to compute step `step`'s update (answered by `update` or `error`)."""

    type: ClassVar[str] = "update"
    step: int = field(metadata=bounded(0, 2**31))


@dataclass(frozen=True, slots=True)
class TrainedReport:
    """Step `step`'s update committed at the trainer (weights `version`): its `trained` trajectories were
    consumed by it; `untrained` ones were left out of it (`reason` says why). Sent after the trajectories'
    own reports, so their records say `trained` only once it is true."""

    type: ClassVar[str] = "trained"
    step: int = field(metadata=bounded(0, 2**31))
    version: int = field(metadata=bounded(0, 2**31))
    trained: list[str] = field(default_factory=list, metadata=bounded(max_len=MAX_TRAJECTORIES))
    untrained: list[str] = field(default_factory=list, metadata=bounded(max_len=MAX_TRAJECTORIES))
    reason: str = field(default="", metadata=bounded(max_len=MAX_MESSAGE_CHARS))


DRIVER_MESSAGES: dict[str, type] = {
    c.type: c
    for c in (
        Hello,
        ProgressReport,
        SignalReport,
        TelemetryReport,
        CheckpointReport,
        UpdateRequest,
        TrajectoryReport,
        TrainedReport,
    )
}


# ---------------------------------------------------------------- control plane -> driver
@dataclass(frozen=True, slots=True)
class RoutableWorker:
    """A rollout worker the driver may route to: active, with its data-plane endpoint."""

    worker: int  # the worker's stable slot id in the job
    role: Role
    endpoint: str = field(metadata=bounded(max_len=2048))
    overlap: bool = False  # on a borrowed training GPU
    gpus: int = field(default=1, metadata=bounded(1, 64))
    weight_version: int = field(default=0, metadata=bounded(0))
    # its chip's speed relative to the job's fastest (`predictor.serving_rates`): the sticky router homes by it
    rate: float = field(default=1.0, metadata=bounded(0.001, 1.0))


@dataclass(frozen=True, slots=True)
class JobView:
    name: str = field(metadata=bounded(max_len=63))
    environment: str = field(metadata=bounded(max_len=64))
    model: str = field(metadata=bounded(max_len=512))  # a profile's model or a model directory's path
    engine: str = field(metadata=bounded(max_len=16))
    batch_size: int = field(metadata=bounded(1, 1 << 20))
    group_size: int = field(metadata=bounded(1, 1 << 20))
    max_staleness: int = field(metadata=bounded(0, 1024))
    max_trajectory_tokens: int = field(metadata=bounded(1, 1 << 22))
    return_deadline_s: float = field(metadata=bounded(0.0, 86400.0))
    seed: int = field(default=0, metadata=bounded(0, 2**62))
    training_gpus: int = field(default=1, metadata=bounded(0, 1 << 20))
    agent: dict[str, Any] = field(default_factory=dict)  # environment "agent": agent_command, tasks, ... (issue 19)
    # the job's policy's dispatch rule (core.loop.LoopConfig.dispatch / dispatch_cap): RLBoost+ routes
    # by join-shortest-queue live as in the simulator
    dispatch: str = field(default="sticky", metadata=bounded(max_len=8))
    dispatch_cap: int = field(default=0, metadata=bounded(0, 1 << 20))


@dataclass(frozen=True, slots=True)
class DecisionView:
    """The scheduler's latest decision for the job: the loop records its prediction against the step
    (predicted vs observed makespan, in the job's clock) and the configuration the step ran with."""

    id: int = field(metadata=bounded(0))
    signal: str = field(metadata=bounded(max_len=32))
    mode: str = field(metadata=bounded(max_len=16))
    n_prefill: int = field(default=0, metadata=bounded(0, 1 << 20))
    n_decode: int = field(default=0, metadata=bounded(0, 1 << 20))
    n_colocated: int = field(default=0, metadata=bounded(0, 1 << 20))
    predicted_makespan_s: float = field(default=0.0, metadata=bounded(0.0, 1e12))  # 0: none
    reconfigured: bool = False  # the decision changed the configuration (a transition carries it out)


@dataclass(frozen=True, slots=True)
class ClusterView:
    """Everything the driver routes by, in full every time (level-triggered)."""

    type: ClassVar[str] = "cluster"
    workers: list[RoutableWorker] = field(metadata=bounded(max_len=MAX_WORKERS))
    weight_version: int = field(metadata=bounded(0))
    training_active: bool  # Training Begin .. Training Finished
    borrowed: int = field(metadata=bounded(0))  # overlap workers not yet back (active or in transition)
    trainer: str = field(default="", metadata=bounded(max_len=2048))  # the trainer's endpoint ("" until known)
    stopped: bool = False  # the job ended: finish nothing new, exit
    decision: DecisionView | None = None  # the latest decision (None before the first)


@dataclass(frozen=True, slots=True)
class Welcome:
    type: ClassVar[str] = "welcome"
    job: JobView
    cluster: ClusterView
    dataplane_token: str = field(metadata=bounded(max_len=256))  # opens this job's workers and trainer
    checkpoint: dict[str, Any] = field(default_factory=dict)  # the loop's last checkpoint ({} = fresh)


@dataclass(frozen=True, slots=True)
class UpdateGranted:
    """The trainer may compute step `step`'s update now (every borrowed worker is back)."""

    type: ClassVar[str] = "update"
    step: int = field(metadata=bounded(0, 2**31))


CONTROL_MESSAGES: dict[str, type] = {c.type: c for c in (Welcome, ClusterView, UpdateGranted, ErrorReply)}

# frames within the agent link's limits (the consumer decoded both links' frames alike before the one codec)
DRIVER_LINK = WireProtocol("driver link", max_bytes=1 << 20, max_depth=16, storable=True, int_min=0)


__all__ = [
    "DRIVER_LINK",
    "CheckpointReport",
    "ClusterView",
    "Hello",
    "JobView",
    "ProgressReport",
    "RoutableWorker",
    "SignalReport",
    "TelemetryReport",
    "TrainedReport",
    "TrajectoryReport",
    "TrajectorySummary",
    "UpdateGranted",
    "UpdateRequest",
    "Welcome",
]
