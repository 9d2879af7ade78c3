"""The loop's messages: the events a driver feeds in and the commands the loop hands back (docs/design.md §10).

Both are frozen dataclasses and closed unions (`Event`, `Command`): a driver carries out every kind of
`Command` through `controlplane.core.loop.sink.dispatch`, which makes a missing handler a type error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from controlplane.core import telemetry as tm
from controlplane.core.context import Signal
from controlplane.core.state import Configuration, Role


# ==================================================================================== events
@dataclass(frozen=True, slots=True)
class Start:
    """Begin (or, after `restore`, resume) the loop."""

    now_s: float


@dataclass(frozen=True, slots=True)
class Stop:
    """Start no new step; what is in flight finishes."""

    now_s: float


@dataclass(frozen=True, slots=True)
class TrajectoryStarted:
    """The trajectory's first prompt is ready (its environment was reset)."""

    now_s: float
    trajectory: str
    prompt_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Prefilled:
    """Disaggregated: `worker` prefilled the turn's prompt and holds its KV cache."""

    now_s: float
    trajectory: str
    worker: int
    prefilled_tokens: int = 0


@dataclass(frozen=True, slots=True)
class TurnGenerated:
    """The turn's response is complete (colocated worker, or decode worker)."""

    now_s: float
    trajectory: str
    worker: int
    generated_tokens: int
    prefilled_tokens: int = 0
    weight_version: int | None = None  # the weights the engine generated with, if it says
    # seconds this request spent in decode iterations (engine-reported; None: the loop estimates it,
    # from the KV hand-off on a decode worker, or the whole service time on a colocated one)
    decode_s: float | None = None


@dataclass(frozen=True, slots=True)
class TurnInterrupted:
    """The request was taken off `worker` (drain, return, preemption); its generated prefix is kept."""

    now_s: float
    trajectory: str
    worker: int
    generated_tokens: int = 0
    prefilled_tokens: int = 0
    decode_s: float | None = None  # as TurnGenerated.decode_s, for the interrupted part


@dataclass(frozen=True, slots=True)
class EnvStepped:
    """The environment ran the turn's tool call: the next prompt is ready, or the trajectory is done."""

    now_s: float
    trajectory: str
    env_time_s: float
    done: bool
    reward: float = 0.0
    observation_tokens: int = 0  # prompt tokens appended for the next turn
    failed: str = ""  # why the environment failed (an external agent's run): the trajectory restarts on its task
    # the failure is final (the member's last allowed attempt): no restart; the member leaves its step's batch,
    # which trains its group's survivors (a group left with fewer than 2 is dropped)
    final: bool = False


@dataclass(frozen=True, slots=True)
class TrajectoryRecovered:
    """The trajectory finished before its rollout driver restarted: its samples are durable at the trainer
    (acknowledged before the old driver counted it), so it counts as finished with `reward` and is not run again.
    For a live trajectory of a step not yet trained (restored from the checkpoint, or started again under its id
    by a step the checkpoint did not show); else ignored."""

    now_s: float
    trajectory: str
    reward: float = 0.0
    weight_version: int | None = None  # the oldest weights that generated any of its samples (None: not known)
    turns: int = 0  # its turns (samples), for its step's STEP record


@dataclass(frozen=True, slots=True)
class WorkerReady:
    """`worker` serves `role` from now on (joined, re-roled, or borrowed overlap worker activated)."""

    now_s: float
    worker: int
    role: Role
    overlap: bool = False
    gpus: int = 1
    rate: float = 1.0  # relative serving speed (its chip's): the sticky router homes trajectories in proportion


@dataclass(frozen=True, slots=True)
class WorkerGone:
    """`worker` takes no new requests (draining, returned, preempted, stopped)."""

    now_s: float
    worker: int
    reason: str = "stop"


@dataclass(frozen=True, slots=True)
class Admission:
    """New-request admission paused (atomic finalisation of a joining group) or resumed."""

    now_s: float
    open: bool


@dataclass(frozen=True, slots=True)
class ReturnConfirmed:
    """Every borrowed overlap worker is back (inactive); the trainer may use its GPUs."""

    now_s: float


@dataclass(frozen=True, slots=True)
class TrainingDone:
    now_s: float
    step: int
    loss: float = 0.0
    missing: int = 0  # trajectories of the step whose samples the trainer did not have (lost)


@dataclass(frozen=True, slots=True)
class WeightsPublished:
    now_s: float
    version: int


@dataclass(frozen=True, slots=True)
class Decided:
    """The scheduler decided at a signal: the configuration it targets and its predicted makespan."""

    now_s: float
    signal: Signal
    configuration: Configuration | None
    predicted_makespan_s: float | None
    reconfigured: bool


@dataclass(frozen=True, slots=True)
class Tick:
    now_s: float


Event: TypeAlias = (
    Start
    | Stop
    | TrajectoryStarted
    | Prefilled
    | TurnGenerated
    | TurnInterrupted
    | EnvStepped
    | TrajectoryRecovered
    | WorkerReady
    | WorkerGone
    | Admission
    | ReturnConfirmed
    | TrainingDone
    | WeightsPublished
    | Decided
    | Tick
)


# ==================================================================================== commands
@dataclass(frozen=True, slots=True)
class TrajectoryRef:
    trajectory: str
    group: int
    index: int  # position in the batch (the task: replacements keep it)


@dataclass(frozen=True, slots=True)
class StartStep:
    """Reset B environments (one task per GRPO group) and report TrajectoryStarted for each."""

    step: int
    weight_version: int
    trajectories: tuple[TrajectoryRef, ...]


@dataclass(frozen=True, slots=True)
class RouteTurn:
    """Send the turn's prompt to `worker` (colocated: the whole turn; prefill: then report Prefilled)."""

    trajectory: str
    worker: int
    turn: int
    min_weight_version: int


@dataclass(frozen=True, slots=True)
class Resubmit:
    """Resume an interrupted turn on `worker`: prompt + the `kept_tokens` already generated."""

    trajectory: str
    worker: int
    turn: int
    kept_tokens: int
    min_weight_version: int


@dataclass(frozen=True, slots=True)
class RouteDecode:
    """KV hand-off: `worker` pulls the prefilled KV cache from `source` and decodes the turn."""

    trajectory: str
    worker: int
    source: int
    min_weight_version: int


@dataclass(frozen=True, slots=True)
class Abort:
    """Drop the trajectory (its data is too stale); start `replacement` on the same task."""

    trajectory: str
    reason: str
    replacement: TrajectoryRef | None = None


@dataclass(frozen=True, slots=True)
class EmitSignal:
    """An elastic signal for the scheduler: budget → decide → plan → execute (report back `Decided`)."""

    signal: Signal
    remaining: int  # R


@dataclass(frozen=True, slots=True)
class ReturnOverlap:
    """Return every borrowed overlap worker (drain, keep partial trajectories) by `deadline_s`;
    report ReturnConfirmed once none is active."""

    deadline_s: float
    workers: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Train:
    """Run the update for batch `step` on these GRPO groups (trajectory ids); report TrainingDone. `dropped`:
    finished trajectories of the step not to train (their group lost members and kept fewer than 2)."""

    step: int
    weight_version: int
    groups: tuple[tuple[str, ...], ...]
    dropped: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PublishWeights:
    """Publish weights `version` (workers pull them lazily); report WeightsPublished."""

    version: int


@dataclass(frozen=True, slots=True)
class Telemetry:
    record: tm.TelemetryRecord


@dataclass(frozen=True, slots=True)
class Progress:
    """R changed: `remaining` of the step's `batch_size` trajectories are unfinished."""

    step: int
    remaining: int
    batch_size: int


Command: TypeAlias = (
    StartStep
    | RouteTurn
    | Resubmit
    | RouteDecode
    | Abort
    | EmitSignal
    | ReturnOverlap
    | Train
    | PublishWeights
    | Telemetry
    | Progress
)
