"""The asynchronous RL loop as a pure state machine: events in, commands out (DESIGN §7).

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
- the progress figure R, the elastic signals, and the TURN / STEP / TRAIN telemetry records.

What happens to a command is the driver's business (the simulator's world, or real engines,
environments and the control plane); what happened comes back as an event.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, Callable, Union

from controlplane.core import telemetry as tm
from controlplane.core.context import Signal
from controlplane.core.router import Router
from controlplane.core.state import Configuration, Mode, Role


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


@dataclass(frozen=True, slots=True)
class WorkerReady:
    """`worker` serves `role` from now on (joined, re-roled, or borrowed overlap worker activated)."""

    now_s: float
    worker: int
    role: Role
    overlap: bool = False
    gpus: int = 1


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


Event = Union[Start, Stop, TrajectoryStarted, Prefilled, TurnGenerated, TurnInterrupted, EnvStepped, WorkerReady,
              WorkerGone, Admission, ReturnConfirmed, TrainingDone, WeightsPublished, Decided, Tick]


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
    """Run the update for batch `step` on these GRPO groups (trajectory ids); report TrainingDone."""

    step: int
    weight_version: int
    groups: tuple[tuple[str, ...], ...]


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


Command = Union[StartStep, RouteTurn, Resubmit, RouteDecode, Abort, EmitSignal, ReturnOverlap, Train,
                PublishWeights, Telemetry, Progress]


# ==================================================================================== state
class TrajState(StrEnum):
    WAITING = "waiting"  # queued for a worker
    FIRST = "first"  # on a colocated or prefill worker
    DECODE = "decode"  # on a decode worker (after the KV hand-off)
    ENV = "env"  # the environment is running its tool call
    DONE = "done"
    ABORTED = "aborted"


class Trainer(StrEnum):
    IDLE = "idle"
    RETURNING = "returning"  # Training Begin sent, waiting for ReturnConfirmed
    TRAINING = "training"
    PUBLISHING = "publishing"


@dataclass(slots=True)
class Traj:
    """One trajectory's progress and accounting (partial progress survives interruptions)."""

    tid: str
    step: int
    group: int
    index: int
    version: int  # weights version when it started
    min_version: int  # oldest weights that generated any of it
    start_s: float = 0.0
    state: TrajState = TrajState.WAITING
    worker: int | None = None
    turn: int = 0
    turn_start_s: float = 0.0
    gen_in_turn: int = 0
    pre_in_turn: int = 0
    generated: int = 0  # tokens generated into the sample
    prompt: int = 0  # prompt tokens appended (first prompt + observations)
    prefilled: int = 0  # prompt tokens engines prefilled (cache misses)
    gen_time_s: float = 0.0  # being served (queue + prefill + decode)
    env_time_s: float = 0.0
    decode_time_s: float = 0.0  # decoding only (no queueing, no prefill): the numerator of f
    decode_in_turn_s: float = 0.0
    decode_since_s: float = -1.0  # when the KV hand-off put the turn on a decode worker
    end_s: float = 0.0
    reward: float = 0.0
    interruptions: int = 0


@dataclass(slots=True)
class StepState:
    step: int
    start_s: float
    version: int  # weights version when the step started
    trajectories: list[str]
    remaining: int
    end_s: float = 0.0
    predicted_makespan_s: float = 0.0
    predicted_at_start_s: float = 0.0
    configuration: str = ""
    generated_tokens: int = 0  # every token generated for this step's trajectories (incl. aborted ones)
    borrowed_gpu_s: float = 0.0
    stale_aborted: int = 0
    interruptions: int = 0


# ==================================================================================== the loop
class RolloutLoop:
    """`cmds = loop.handle(event)`; the driver carries the commands out, in order."""

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
        self.trainer = Trainer.IDLE
        self.training_active = False  # Training Begin .. Training Finished
        self.tb_s = 0.0
        self.train_start_s = 0.0
        self.return_latency_s = 0.0
        self.loss = 0.0
        self.missing = 0
        self.resumed = False  # restored from a checkpoint: unfinished trajectories restart on Start
        self.waiting: deque[str] = deque()  # trajectories with a turn to route and no worker yet
        self.admission_open = True
        self.overlap: dict[int, tuple[float, int]] = {}  # serving overlap worker -> (since, gpus)
        self.last_periodic_s = 0.0
        self.configuration: Configuration | None = None
        # run totals
        self.deadline_misses = 0
        self.stale_aborted = 0
        self.started_trajectories = 0
        self.finished_trajectories = 0
        self._out: list[Command] = []
        self._replacements: dict[int, int] = {}  # batch index -> restarts (replacement ids)

    # ------------------------------------------------------------------ entry point
    def handle(self, ev: Event) -> list[Command]:
        out = self._out = []
        fn = _HANDLERS[type(ev)]
        fn(self, ev)
        return out

    def _emit(self, cmd: Command) -> None:
        self._out.append(cmd)

    @property
    def remaining(self) -> int:
        """R: unfinished trajectories of the step in flight (B between steps)."""
        st = self.steps.get(self.step)
        return st.remaining if st is not None and self.rollout_active else self.cfg.batch_size

    def min_weight_version(self, t: Traj) -> int:
        return max(0, t.step - self.cfg.max_staleness)

    # ------------------------------------------------------------------ step cycle
    def _on_start(self, ev: Start) -> None:
        self.started = True
        self.stopped = False
        if self.resumed:
            self.resumed = False
            self._resume(ev.now_s)
        self._maybe_train(ev.now_s)
        self._maybe_start_step(ev.now_s)

    def _resume(self, now: float) -> None:
        """After `restore`: the old driver's requests and environments died with it. Finished
        trajectories keep their samples (they went to the trainer as they finished); unfinished ones
        restart on their task; the trainer handshake picks up where it was (its commands are
        idempotent)."""
        if self.rollout_active:
            for t in list(self.trajs.values()):
                if t.step == self.step and t.state not in (TrajState.DONE, TrajState.ABORTED):
                    self._restart(t, now, "the rollout driver restarted", stale=False)
        if self.trainer is Trainer.RETURNING:
            self._emit(ReturnOverlap(self.tb_s + self.cfg.return_deadline_s, ()))
        elif self.trainer is Trainer.TRAINING:
            self._emit(self._train_command())
        elif self.trainer is Trainer.PUBLISHING:
            self._emit(PublishWeights(self.ready[0] + 1))

    def _on_stop(self, ev: Stop) -> None:
        self.stopped = True

    def _maybe_start_step(self, now: float) -> None:
        j = self.step + 1
        cfg = self.cfg
        if (self.rollout_active or self.stopped or not self.started or self.version < j - cfg.max_staleness
                or (cfg.max_steps is not None and j >= cfg.max_steps)):
            return
        self.step = j
        self.rollout_active = True
        refs = tuple(TrajectoryRef(f"s{j}-t{i}", i // cfg.group_size, i) for i in range(cfg.batch_size))
        st = StepState(j, now, self.version, [r.trajectory for r in refs], cfg.batch_size)
        self.steps[j] = st
        for r in refs:
            self.trajs[r.trajectory] = Traj(r.trajectory, j, r.group, r.index, self.version, self.version, now)
        self.started_trajectories += len(refs)
        self.last_periodic_s = now
        self._emit(EmitSignal(Signal.STEP_START, cfg.batch_size))
        self._emit(StartStep(j, self.version, refs))
        self._emit(Progress(j, cfg.batch_size, cfg.batch_size))

    def _batch_complete(self, st: StepState, now: float) -> None:
        st.end_s = now
        self.rollout_active = False
        self._account_overlap(now)
        self._emit(Telemetry(self._step_record(st, now)))
        self.ready.append(st.step)
        self._maybe_train(now)
        self._maybe_start_step(now)

    # ------------------------------------------------------------------ training handshake
    def _maybe_train(self, now: float) -> None:
        if self.trainer is not Trainer.IDLE or not self.ready or self.ready[0] != self.trained_next:
            return
        self.trainer = Trainer.RETURNING
        self.training_active = True
        self.tb_s = now
        # borrowed workers stop taking turns now; their in-flight turns come back as TurnInterrupted
        for w in list(self.overlap):
            self.router.remove(w)
        self._emit(EmitSignal(Signal.TRAINING_BEGIN, self.remaining))
        self._emit(ReturnOverlap(now + self.cfg.return_deadline_s, tuple(sorted(self.overlap))))

    def _on_return_confirmed(self, ev: ReturnConfirmed) -> None:
        if self.trainer is not Trainer.RETURNING:
            return
        self._account_overlap(ev.now_s, drop=True)
        self.return_latency_s = ev.now_s - self.tb_s
        if self.return_latency_s > self.cfg.return_deadline_s + 1e-9:
            self.deadline_misses += 1
        self.trainer = Trainer.TRAINING
        self.train_start_s = ev.now_s
        self._emit(self._train_command())

    def _train_command(self) -> Train:
        j = self.ready[0]
        groups: dict[int, list[str]] = {}
        for tid in self.steps[j].trajectories:
            groups.setdefault(self.trajs[tid].group, []).append(tid)
        return Train(j, self.version, tuple(tuple(g) for _, g in sorted(groups.items())))

    def _on_training_done(self, ev: TrainingDone) -> None:
        if self.trainer is not Trainer.TRAINING or not self.ready or ev.step != self.ready[0]:
            return
        self.trainer = Trainer.PUBLISHING
        self.loss, self.missing = ev.loss, ev.missing
        self._emit(PublishWeights(ev.step + 1))

    def _on_weights_published(self, ev: WeightsPublished) -> None:
        if self.trainer is not Trainer.PUBLISHING or ev.version != self.ready[0] + 1:
            self.version = max(self.version, ev.version)
            return
        j = self.ready.popleft()
        self.version = ev.version
        self.trained_next = j + 1
        self.trainer = Trainer.IDLE
        self._emit(Telemetry(tm.train(
            time_s=ev.now_s, job=self.cfg.job, step=j, duration_s=ev.now_s - self.train_start_s,
            return_latency_s=self.return_latency_s, return_deadline_s=self.cfg.return_deadline_s,
            loss=self.loss, weight_version=ev.version, trajectories=len(self.steps[j].trajectories),
            missing_trajectories=self.missing)))
        for tid in self.steps[j].trajectories:  # trained: the step's books are closed
            self.trajs.pop(tid, None)
        if self.ready and self.ready[0] == self.trained_next:
            self._maybe_train(ev.now_s)  # the next update starts at once: no borrow window
        else:
            self.training_active = False
            self._emit(EmitSignal(Signal.TRAINING_FINISHED, self.remaining))
        self._maybe_start_step(ev.now_s)

    # ------------------------------------------------------------------ workers and routing
    def _on_worker_ready(self, ev: WorkerReady) -> None:
        if ev.overlap:
            if self.training_active:
                return  # never route to a training GPU while the trainer owns it
            self.overlap.setdefault(ev.worker, (ev.now_s, ev.gpus))
        self.router.add(ev.worker, ev.role)
        self._flush(ev.now_s)

    def _on_worker_gone(self, ev: WorkerGone) -> None:
        self.router.remove(ev.worker)
        since = self.overlap.pop(ev.worker, None)
        if since is not None:
            self._borrowed(ev.now_s - since[0], since[1])

    def _on_admission(self, ev: Admission) -> None:
        self.admission_open = ev.open
        if ev.open:
            self._flush(ev.now_s)

    def _flush(self, now: float) -> None:
        if not self.waiting or not self.admission_open or self.router.mode is None:
            return
        q, self.waiting = self.waiting, deque()
        for tid in q:
            t = self.trajs.get(tid)
            if t is not None and t.state is TrajState.WAITING:
                self._route(t)

    def _route(self, t: Traj) -> None:
        t.state = TrajState.WAITING
        t.worker = None
        if not self.admission_open:
            self.waiting.append(t.tid)
            return
        if self.cfg.dispatch == "jsq":
            w = self.router.pick_first(t.tid, self._first_load(), self.cfg.dispatch_cap)
        else:
            w = self.router.pick_first(t.tid)
        if w is None:
            self.waiting.append(t.tid)
            return
        t.state = TrajState.FIRST
        t.worker = w
        mv = self.min_weight_version(t)
        if t.gen_in_turn:
            self._emit(Resubmit(t.tid, w, t.turn, t.gen_in_turn, mv))
        else:
            self._emit(RouteTurn(t.tid, w, t.turn, mv))

    def _first_load(self) -> dict[int, int]:
        """Turns in flight on each colocated or prefill worker (routed there, not yet back)."""
        load: dict[int, int] = {}
        for t in self.trajs.values():
            if t.state is TrajState.FIRST and t.worker is not None:
                load[t.worker] = load.get(t.worker, 0) + 1
        return load

    def _turn_left(self, now: float) -> None:
        """A worker has one turn fewer in flight: a turn held by delayed dispatch may go now."""
        if self.cfg.dispatch_cap and self.waiting:
            self._flush(now)

    # ------------------------------------------------------------------ trajectories
    def _live(self, tid: str) -> Traj | None:
        t = self.trajs.get(tid)
        return t if t is not None and t.state not in (TrajState.DONE, TrajState.ABORTED) else None

    def _on_worker(self, tid: str, worker: int) -> Traj | None:
        """The trajectory, if `worker` is serving its turn now (late or duplicate reports are dropped)."""
        t = self._live(tid)
        if t is None or t.state not in (TrajState.FIRST, TrajState.DECODE) or t.worker != worker:
            return None
        return t

    def _on_trajectory_started(self, ev: TrajectoryStarted) -> None:
        t = self._live(ev.trajectory)
        if t is None:
            return
        t.start_s = t.turn_start_s = ev.now_s
        t.prompt += ev.prompt_tokens
        self._route(t)

    def _on_prefilled(self, ev: Prefilled) -> None:
        t = self._on_worker(ev.trajectory, ev.worker)
        if t is None or t.state is not TrajState.FIRST:
            return
        t.pre_in_turn += ev.prefilled_tokens
        d = self.router.pick_decode()
        if d is None:  # no decode worker (mode changed): prefill again elsewhere
            t.interruptions += 1
            self.steps[t.step].interruptions += 1
            self._route(t)
            return
        t.state = TrajState.DECODE
        t.worker = d
        t.decode_since_s = ev.now_s
        self._emit(RouteDecode(t.tid, d, ev.worker, self.min_weight_version(t)))
        self._turn_left(ev.now_s)

    def _took_tokens(self, t: Traj, ev: TurnGenerated | TurnInterrupted) -> None:
        self._decode_time(t, ev)
        if t.state is TrajState.DECODE and t.worker is not None:
            self.router.decode_done(t.worker)
        t.gen_in_turn += ev.generated_tokens
        t.generated += ev.generated_tokens
        t.pre_in_turn += ev.prefilled_tokens
        self.steps[t.step].generated_tokens += ev.generated_tokens

    def _decode_time(self, t: Traj, ev: TurnGenerated | TurnInterrupted) -> None:
        """Decode-active time of the turn (f excludes queueing and prefill): the engine's figure when
        it reports one; else, on a decode worker, the time since the KV hand-off; else (colocated,
        no report) the turn's whole service time, the only figure the loop has."""
        if ev.decode_s is not None:
            piece = max(0.0, ev.decode_s)
        elif t.state is TrajState.DECODE and t.decode_since_s >= 0:
            piece = max(0.0, ev.now_s - t.decode_since_s)
        elif isinstance(ev, TurnGenerated):
            piece = max(0.0, ev.now_s - t.turn_start_s - t.decode_in_turn_s)
        else:
            piece = 0.0
        t.decode_since_s = -1.0
        t.decode_time_s += piece
        t.decode_in_turn_s += piece

    def _on_turn_generated(self, ev: TurnGenerated) -> None:
        t = self._on_worker(ev.trajectory, ev.worker)
        if t is None:
            return
        self._took_tokens(t, ev)
        t.gen_time_s += ev.now_s - t.turn_start_s
        t.state = TrajState.ENV
        t.worker = None
        self._turn_left(ev.now_s)
        if ev.weight_version is not None and ev.weight_version < t.min_version:
            t.min_version = ev.weight_version
            if self._stale(t):
                self._restart(t, ev.now_s, "stale", stale=True)

    def _on_turn_interrupted(self, ev: TurnInterrupted) -> None:
        t = self._on_worker(ev.trajectory, ev.worker)
        if t is None:
            return
        self._took_tokens(t, ev)
        t.interruptions += 1
        self.steps[t.step].interruptions += 1
        self._route(t)

    def _on_env_stepped(self, ev: EnvStepped) -> None:
        t = self._live(ev.trajectory)
        if t is None or t.state is not TrajState.ENV:
            return
        t.env_time_s += ev.env_time_s
        t.prefilled += t.pre_in_turn
        self._emit(Telemetry(tm.turn(time_s=ev.now_s, job=self.cfg.job, step=t.step, trajectory=t.tid, turn=t.turn,
                                     new_prompt_tokens=t.pre_in_turn, generated_tokens=t.gen_in_turn,
                                     env_time_s=ev.env_time_s)))
        t.turn += 1
        t.gen_in_turn = t.pre_in_turn = 0
        t.decode_in_turn_s = 0.0
        if not ev.done:
            t.prompt += ev.observation_tokens
            t.turn_start_s = ev.now_s
            self._route(t)
            return
        t.reward = ev.reward
        if self._stale(t):
            self._restart(t, ev.now_s, "stale", stale=True)
            return
        t.state = TrajState.DONE
        t.end_s = ev.now_s
        self.router.unhome(t.tid)
        self.finished_trajectories += 1
        st = self.steps[t.step]
        st.remaining -= 1
        self._emit(Progress(st.step, st.remaining, self.cfg.batch_size))
        if st.remaining == 0:
            self._batch_complete(st, ev.now_s)

    def _stale(self, t: Traj) -> bool:
        """Batch j is trained from weights j: data from weights older than j − α is too stale."""
        return t.step - t.min_version > self.cfg.max_staleness

    def _restart(self, t: Traj, now: float, why: str, *, stale: bool) -> None:
        """Abort `t` and start a replacement on the same task (same group, same batch position)."""
        if t.state is TrajState.DECODE and t.worker is not None:
            self.router.decode_done(t.worker)
        t.state = TrajState.ABORTED
        self.router.unhome(t.tid)
        st = self.steps[t.step]
        if stale:
            self.stale_aborted += 1
            st.stale_aborted += 1
            why = f"stale: step {t.step} has data from weights v{t.min_version} (max staleness {self.cfg.max_staleness})"
        n = self._replacements.get(t.index, 0) + 1
        self._replacements[t.index] = n
        ref = TrajectoryRef(f"s{t.step}-t{t.index}-r{n}", t.group, t.index)
        st.trajectories[st.trajectories.index(t.tid)] = ref.trajectory
        self.trajs[ref.trajectory] = Traj(ref.trajectory, t.step, t.group, t.index, self.version, self.version, now)
        self.started_trajectories += 1
        self._emit(Abort(t.tid, why, ref))

    # ------------------------------------------------------------------ scheduler feedback, time
    def _on_decided(self, ev: Decided) -> None:
        if ev.configuration is not None and ev.configuration.total > 0:
            self.configuration = ev.configuration
        st = self.steps.get(self.step)
        if st is None or not self.rollout_active:
            return
        pred = ev.predicted_makespan_s
        if pred is None or not math.isfinite(pred) or pred <= 0:
            return
        if ev.signal is Signal.STEP_START or ev.reconfigured or st.predicted_makespan_s <= 0:
            # elapsed time plus the remaining fraction R/B of the prediction (Eq. 7's fluid view); live,
            # a step's first decision may come under another signal (several queued at once are planned
            # as the weightiest)
            st.predicted_makespan_s = (ev.now_s - st.start_s) + st.remaining / self.cfg.batch_size * pred
            if ev.signal is Signal.STEP_START:
                st.predicted_at_start_s = pred
        if ev.signal is Signal.STEP_START and self.configuration is not None:
            st.configuration = self.configuration.label()

    def _on_tick(self, ev: Tick) -> None:
        p = self.cfg.periodic_s
        if p and self.rollout_active and ev.now_s - self.last_periodic_s >= p - 1e-9:
            self.last_periodic_s = ev.now_s
            self._emit(EmitSignal(Signal.PERIODIC, self.remaining))

    # ------------------------------------------------------------------ figures
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

    def _step_record(self, st: StepState, now: float) -> tm.TelemetryRecord:
        trajs = [self.trajs[tid] for tid in st.trajectories]
        n = len(trajs)
        turns = [t.turn for t in trajs]
        n_turns = max(1, sum(turns))
        last = max(trajs, key=lambda t: t.end_s)
        gen = sum(t.gen_time_s for t in trajs)
        env = sum(t.env_time_s for t in trajs)
        dec = sum(min(t.decode_time_s, t.gen_time_s) for t in trajs)
        cfg = self.configuration
        return tm.step(
            time_s=now, job=self.cfg.job, step=st.step, batch_size=n, turns_max=max(turns), turns_mean=sum(turns) / n,
            new_prompt_tokens_mean=sum(t.prefilled for t in trajs) / n_turns,
            generated_tokens_mean=sum(t.generated for t in trajs) / n_turns,
            env_time_total_s=last.env_time_s, active_decode_fraction=dec / (gen + env) if gen + env > 0 and dec > 0 else 1.0,
            makespan_s=now - st.start_s, predicted_makespan_s=st.predicted_makespan_s,
            predicted_at_start_s=st.predicted_at_start_s,
            mode=str(cfg.mode) if cfg else "", n_prefill=cfg.n_prefill if cfg else 0,
            n_decode=cfg.n_decode if cfg else 0, n_colocated=cfg.n_colocated if cfg else 0,
            generated_tokens_total=st.generated_tokens, train_tokens=sum(t.prompt + t.generated for t in trajs),
            reward_mean=sum(t.reward for t in trajs) / n, borrowed_gpu_s=st.borrowed_gpu_s,
            stale_aborted=st.stale_aborted, interruptions=st.interruptions,
        )

    # ------------------------------------------------------------------ durability
    def checkpoint(self) -> dict[str, Any]:
        """What the loop must not lose, as JSON: the step, the weight version, the trainer's place in
        the handshake and every live trajectory's accounting (turn boundaries and kept tokens)."""
        return {
            "version": self.version, "step": self.step, "rollout_active": self.rollout_active,
            "trained_next": self.trained_next, "ready": list(self.ready), "trainer": str(self.trainer),
            "training_active": self.training_active, "tb_s": self.tb_s, "train_start_s": self.train_start_s,
            "return_latency_s": self.return_latency_s, "loss": self.loss, "missing": self.missing, "deadline_misses": self.deadline_misses,
            "stale_aborted": self.stale_aborted, "started_trajectories": self.started_trajectories,
            "finished_trajectories": self.finished_trajectories, "replacements": {str(k): v for k, v in self._replacements.items()},
            "steps": [asdict(s) for s in self.steps.values()],
            "trajectories": [{**asdict(t), "state": str(t.state)} for t in self.trajs.values()],
            "configuration": self.configuration.label() if self.configuration else "",
        }

    @classmethod
    def restore(cls, config: LoopConfig, data: dict[str, Any]) -> "RolloutLoop":
        """Rebuild a loop from `checkpoint()`. Workers are learnt again from WorkerReady events; on
        `Start`, unfinished turns are routed again from their kept progress."""
        loop = cls(config)
        loop.version, loop.step = int(data["version"]), int(data["step"])
        loop.rollout_active = bool(data["rollout_active"])
        loop.trained_next = int(data["trained_next"])
        loop.ready = deque(int(x) for x in data["ready"])
        loop.trainer = Trainer(data["trainer"])
        loop.training_active = bool(data["training_active"])
        loop.tb_s, loop.train_start_s = float(data["tb_s"]), float(data["train_start_s"])
        loop.return_latency_s = float(data["return_latency_s"])
        loop.deadline_misses, loop.stale_aborted = int(data["deadline_misses"]), int(data["stale_aborted"])
        loop.started_trajectories = int(data["started_trajectories"])
        loop.finished_trajectories = int(data["finished_trajectories"])
        loop._replacements = {int(k): int(v) for k, v in data.get("replacements", {}).items()}
        for s in data["steps"]:
            loop.steps[int(s["step"])] = StepState(**s)
        for t in data["trajectories"]:
            tr = Traj(**{**t, "state": TrajState(t["state"])})
            loop.trajs[tr.tid] = tr
        loop.loss = float(data.get("loss", 0.0))
        loop.missing = int(data.get("missing", 0))
        loop.resumed = True
        label = data.get("configuration") or ""
        loop.configuration = _parse_label(label)
        return loop


class Feeder:
    """Feeds events to a loop and carries its commands out in order through `dispatch`.

    Events raised while a command is being carried out are queued and handled after the current
    batch, in arrival order: the loop never re-enters itself, and a driver on any clock (the
    simulator's heap, asyncio) sees the same commands for the same events.
    """

    __slots__ = ("loop", "dispatch", "_queue", "_draining")

    def __init__(self, loop: RolloutLoop, dispatch: Callable[[Command], None]) -> None:
        self.loop = loop
        self.dispatch = dispatch
        self._queue: deque[Event] = deque()
        self._draining = False

    def feed(self, event: Event) -> None:
        self._queue.append(event)
        if self._draining:
            return
        self._draining = True
        try:
            q, handle, dispatch = self._queue, self.loop.handle, self.dispatch
            while q:
                for cmd in handle(q.popleft()):
                    dispatch(cmd)
        finally:
            self._draining = False


def _parse_label(label: str) -> Configuration | None:
    """'3P5D' or '8C' back to a Configuration."""
    if not label:
        return None
    if label.endswith("C"):
        return Configuration.colocated(int(label[:-1]))
    p, d = label[:-1].split("P")
    return Configuration(Mode.DISAGGREGATED, n_prefill=int(p), n_decode=int(d))


_HANDLERS: dict[type, Any] = {
    Start: RolloutLoop._on_start, Stop: RolloutLoop._on_stop, TrajectoryStarted: RolloutLoop._on_trajectory_started,
    Prefilled: RolloutLoop._on_prefilled, TurnGenerated: RolloutLoop._on_turn_generated,
    TurnInterrupted: RolloutLoop._on_turn_interrupted, EnvStepped: RolloutLoop._on_env_stepped,
    WorkerReady: RolloutLoop._on_worker_ready, WorkerGone: RolloutLoop._on_worker_gone,
    Admission: RolloutLoop._on_admission, ReturnConfirmed: RolloutLoop._on_return_confirmed,
    TrainingDone: RolloutLoop._on_training_done, WeightsPublished: RolloutLoop._on_weights_published,
    Decided: RolloutLoop._on_decided, Tick: RolloutLoop._on_tick,
}

__all__ = [
    "Abort", "Admission", "Command", "Decided", "EmitSignal", "EnvStepped", "Event", "Feeder", "LoopConfig", "Prefilled",
    "Progress", "PublishWeights", "Resubmit", "ReturnConfirmed", "ReturnOverlap", "RolloutLoop", "RouteDecode",
    "RouteTurn", "Start", "StartStep", "StepState", "Stop", "Telemetry", "Tick", "Train", "TrainingDone", "Traj",
    "TrajState", "TrajectoryRef", "TrajectoryStarted", "TurnGenerated", "TurnInterrupted", "WeightsPublished",
    "WorkerGone", "WorkerReady",
]
