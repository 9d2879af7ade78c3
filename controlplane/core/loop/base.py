"""The loop's state and the step cycle's admission: what every part of `RolloutLoop` reads and writes.

`LoopConfig` (one job's loop settings) and `LoopBase`: the loop's records (`__init__`), how a handler
emits a command and marks a trajectory for the next checkpoint, the weight-version arithmetic of the
staleness bound (`_steps_done`, `_version_for`), admitting the next step (`_maybe_start_step`) and the
borrowed-GPU accounting. The handlers build on it by idea: `training` (the trainer handshake),
`routing` (workers and routing), `machine` (trajectories, scheduler feedback, the entry point).
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass

from controlplane.core.context import Signal
from controlplane.core.loop.messages import Command, EmitSignal, Progress, StartStep, TrajectoryRef
from controlplane.core.loop.state import CheckpointCache, StepState, TrainerPhase, Traj, prompts_per_step
from controlplane.core.router import Router
from controlplane.core.state import Configuration

MAX_STALENESS = 64  # the most weight versions a job may allow its samples to lag (the API's and the simulator's bound)


@dataclass(frozen=True, slots=True)
class LoopConfig:
    batch_size: int  # B trajectories per rollout step
    group_size: int = 1  # GRPO group: trajectories of one task
    max_staleness: int = 1  # α: data may come from weights at most α versions behind the update
    return_deadline_s: float = 30.0  # borrowed workers must be back this long after Training Begin
    periodic_s: float | None = None  # PERIODIC signal interval while a batch is in flight
    max_steps: int | None = None  # start no step beyond this many
    job: str = ""  # stamped on telemetry records
    # How a turn's first worker is chosen: "sticky" (PEARL's router: the trajectory's home unless it is
    # overloaded) or "jsq" (RLBoost's Algorithm 2: join-shortest-queue on turns in flight, ties to the
    # home, delayed dispatch while every worker has `dispatch_cap` turns in flight; 0 = no cap)
    dispatch: str = "sticky"
    dispatch_cap: int = 0

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.group_size < 1:
            raise ValueError("batch_size and group_size must be >= 1")
        if self.max_staleness < 0 or self.return_deadline_s < 0:
            raise ValueError("max_staleness and return_deadline_s must be >= 0")
        if self.dispatch not in ("sticky", "jsq") or self.dispatch_cap < 0:
            raise ValueError("dispatch must be 'sticky' or 'jsq' and dispatch_cap >= 0")


class LoopBase:
    """The loop's records and the helpers every handler uses; `RolloutLoop` is the whole machine."""

    def __init__(self, config: LoopConfig) -> None:
        self.cfg = config
        self.router = Router()
        self.version = 0  # latest published weights
        self.step = -1  # rollout step in flight (or last started)
        self.rollout_active = False
        self.stopped = False
        self.started = False
        self.trajs: dict[str, Traj] = {}
        self.steps: dict[int, StepState] = {}
        self.ready: deque[int] = deque()  # collected batches waiting for the trainer, in order
        self.trained_next = 0
        # the versions that were newest when a step was left without an update (every member gave up or its
        # groups were dropped: no batch, so no new version); the staleness checks count those steps too
        self.skipped: list[int] = []
        self.trainer = TrainerPhase.IDLE
        self.training_active = False  # Training Begin .. Training Finished
        self.tb_s = 0.0
        self.train_start_s = 0.0
        self.return_latency_s = 0.0
        self.loss = 0.0
        self.missing = 0
        self.resumed = False  # restored from a checkpoint: unfinished trajectories restart on Start
        self.waiting: deque[str] = deque()  # trajectories with a turn to route and no worker yet
        self._on_first: dict[int, int] = {}  # colocated or prefill worker -> trajectories FIRST on it (jsq's load)
        self.admission_open = True
        self.overlap: dict[int, tuple[float, int]] = {}  # serving overlap worker -> (since, gpus)
        self.last_periodic_s = 0.0
        self.configuration: Configuration | None = None
        # run totals
        self.deadline_misses = 0
        self.stale_aborted = 0
        self.started_trajectories = 0
        self.prompts_drawn = 0  # the task cursor: prompts drawn so far (a step draws one per group as it starts)
        self.finished_trajectories = 0
        self.failed_trajectories = 0  # environments that failed (external agents): restarted, never rewarded
        self._out: list[Command] = []
        self._replacements: dict[int, int] = {}  # batch index -> restarts (replacement ids)
        # made by the first checkpoint: which trajectories changed since the last one (state.CheckpointCache)
        self._checkpoint_cache: CheckpointCache | None = None

    def _touched(self, tid: str) -> None:
        """`tid`'s record changed (or it was made, or dropped): the next checkpoint encodes it anew."""
        cache = self._checkpoint_cache
        if cache is not None:
            cache.dirty[tid] = None

    def _emit(self, cmd: Command) -> None:
        self._out.append(cmd)

    @property
    def remaining(self) -> int:
        """R: unfinished trajectories of the step in flight (B between steps)."""
        st = self.steps.get(self.step)
        return st.remaining if st is not None and self.rollout_active else self.cfg.batch_size

    def min_weight_version(self, t: Traj) -> int:
        return self._version_for(max(0, t.step - self.cfg.max_staleness))

    def _steps_done(self, version: int) -> int:
        """The steps weights `version` stand for: its updates, plus the steps left without an update while
        it was the newest (one version per trained step, none for an empty one)."""
        return version + bisect.bisect_right(self.skipped, version) if self.skipped else version

    def _version_for(self, steps: int) -> int:
        """The oldest weights that stand for `steps` steps done."""
        if not self.skipped:
            return steps
        v = max(0, steps - len(self.skipped))
        while self._steps_done(v) < steps:
            v += 1
        return v

    def _maybe_start_step(self, now: float) -> None:
        j = self.step + 1
        cfg = self.cfg
        if (
            self.rollout_active
            or self.stopped
            or not self.started
            or self._steps_done(self.version) < j - cfg.max_staleness
            or (cfg.max_steps is not None and j >= cfg.max_steps)
        ):
            return
        self.step = j
        self.rollout_active = True
        refs = tuple(TrajectoryRef(f"s{j}-t{i}", i // cfg.group_size, i) for i in range(cfg.batch_size))
        st = StepState(j, now, self.version, [r.trajectory for r in refs], cfg.batch_size)
        self.steps[j] = st
        for r in refs:
            self.trajs[r.trajectory] = Traj(r.trajectory, j, r.group, r.index, self.version, self.version, now)
            self._touched(r.trajectory)
        self.started_trajectories += len(refs)
        self.prompts_drawn += prompts_per_step(cfg.batch_size, cfg.group_size)
        self.last_periodic_s = now
        self._emit(EmitSignal(Signal.STEP_START, cfg.batch_size))
        self._emit(StartStep(j, self.version, refs))
        self._emit(Progress(j, cfg.batch_size, cfg.batch_size))

    def _borrowed(self, seconds: float, gpus: int) -> None:
        st = self.steps.get(self.step)
        if st is not None:
            st.borrowed_gpu_s += max(0.0, seconds) * gpus

    def _account_overlap(self, now: float, drop: bool = False) -> None:
        for w, (since, gpus) in list(self.overlap.items()):
            self._borrowed(now - since, gpus)
            if drop:
                del self.overlap[w]
            else:
                self.overlap[w] = (now, gpus)
