"""The RL loop's state machine: `cmds = loop.handle(event)` (the etcd/raft `Ready` pattern, DESIGN §7)."""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass
from typing import Any

from controlplane.core import telemetry as tm
from controlplane.core.context import Signal
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
    TrajectoryRef,
    TrajectoryStarted,
    TurnGenerated,
    TurnInterrupted,
    WeightsPublished,
    WorkerGone,
    WorkerReady,
)
from controlplane.core.loop.state import CheckpointCache, StepState, Trainer, Traj, TrajState, decode_into, encode
from controlplane.core.router import Router
from controlplane.core.state import Configuration

STEP_RECORDS_KEPT = 16  # final steps whose records a loop (and its checkpoint) keeps (`_forget_old_steps`)


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
        # the versions that were newest when a step was left without an update (every member gave up or its
        # groups were dropped: no batch, so no new version); the staleness checks count those steps too
        self.skipped: list[int] = []
        self.trainer = Trainer.IDLE
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
        self.finished_trajectories = 0
        self.failed_trajectories = 0  # environments that failed (external agents): restarted, never rewarded
        self._out: list[Command] = []
        self._replacements: dict[int, int] = {}  # batch index -> restarts (replacement ids)
        # made by the first checkpoint: which trajectories changed since the last one (state.CheckpointCache)
        self._checkpoint_cache: CheckpointCache | None = None

    # ------------------------------------------------------------------ entry point
    def handle(self, ev: Event) -> list[Command]:
        out = self._out = []
        fn = _HANDLERS[type(ev)]
        fn(self, ev)
        cache = self._checkpoint_cache
        if cache is not None:  # the event's trajectory may have changed; the handlers mark the others they touch
            tid = getattr(ev, "trajectory", None)
            if tid is not None:
                cache.dirty[tid] = None
        return out

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
        self.last_periodic_s = now
        self._emit(EmitSignal(Signal.STEP_START, cfg.batch_size))
        self._emit(StartStep(j, self.version, refs))
        self._emit(Progress(j, cfg.batch_size, cfg.batch_size))

    def _batch_complete(self, st: StepState, now: float) -> None:
        st.end_s = now
        if st.given_up:
            self._drop_small_groups(st)
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
        if not self.steps[self.ready[0]].trajectories:
            self._skip_update(now)
            return
        self.trainer = Trainer.RETURNING
        self.training_active = True
        self.tb_s = now
        # borrowed workers stop taking turns now; their in-flight turns come back as TurnInterrupted
        for w in list(self.overlap):
            self.router.remove(w)
        self._emit(EmitSignal(Signal.TRAINING_BEGIN, self.remaining))
        self._emit(ReturnOverlap(now + self.cfg.return_deadline_s, tuple(sorted(self.overlap))))

    def _skip_update(self, now: float) -> None:
        """A step with nothing to train (every member gave up, or every group was dropped) publishes no
        weights: no update, no new version; its STEP record says why (`given_up`, `dropped_groups`)."""
        j = self.ready.popleft()
        self.skipped.append(self.version)
        self.trained_next = j + 1
        st = self.steps[j]
        for tid in st.dropped:  # the step's books are closed
            self.trajs.pop(tid, None)
            self._touched(tid)
        self._forget_old_steps()
        self._maybe_train(now)
        if self.trainer is Trainer.IDLE and self.training_active:  # skipped right after an update
            self.training_active = False
            self._emit(EmitSignal(Signal.TRAINING_FINISHED, self.remaining))
        self._maybe_start_step(now)

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
        st = self.steps[j]
        return Train(j, self.version, tuple(tuple(g) for _, g in sorted(groups.items())), tuple(st.dropped))

    def _on_training_done(self, ev: TrainingDone) -> None:
        if self.trainer is not Trainer.TRAINING or not self.ready or ev.step != self.ready[0]:
            return
        self.trainer = Trainer.PUBLISHING
        self.loss, self.missing = ev.loss, ev.missing
        self._emit(PublishWeights(ev.step + 1 - len(self.skipped)))

    def _on_weights_published(self, ev: WeightsPublished) -> None:
        if self.trainer is not Trainer.PUBLISHING or ev.version != self.ready[0] + 1 - len(self.skipped):
            self.version = max(self.version, ev.version)
            return
        j = self.ready.popleft()
        self.version = ev.version
        self.trained_next = j + 1
        self.trainer = Trainer.IDLE
        self._emit(
            Telemetry(
                tm.train(
                    time_s=ev.now_s,
                    job=self.cfg.job,
                    step=j,
                    duration_s=ev.now_s - self.train_start_s,
                    return_latency_s=self.return_latency_s,
                    return_deadline_s=self.cfg.return_deadline_s,
                    loss=self.loss,
                    weight_version=ev.version,
                    trajectories=len(self.steps[j].trajectories),
                    missing_trajectories=self.missing,
                )
            )
        )
        st = self.steps[j]
        for tid in (*st.trajectories, *st.dropped):  # trained: the step's books are closed
            self.trajs.pop(tid, None)
            self._touched(tid)
        self._forget_old_steps()
        if self.ready and self.ready[0] == self.trained_next:
            self._maybe_train(ev.now_s)  # the next update starts at once: no borrow window
        else:
            self.training_active = False
            self._emit(EmitSignal(Signal.TRAINING_FINISHED, self.remaining))
        self._maybe_start_step(ev.now_s)

    def _forget_old_steps(self) -> None:
        """Keep the records of the last STEP_RECORDS_KEPT final steps (trained, and not the step borrowed
        time still goes to), not every step's: a step's record holds its B·G trajectory ids (~13 KiB at
        1,024), so a long run's checkpoint would outgrow its limit. Nothing here reads a final step again;
        its durable history is its STEP telemetry record and its trajectories, in the control plane."""
        final = min(self.trained_next, self.step)
        cache = self._checkpoint_cache
        for j in [j for j in self.steps if j < final - STEP_RECORDS_KEPT]:
            del self.steps[j]
            if cache is not None:
                cache.steps.pop(j, None)

    # ------------------------------------------------------------------ workers and routing
    def _on_worker_ready(self, ev: WorkerReady) -> None:
        if ev.overlap:
            if self.training_active:
                return  # never route to a training GPU while the trainer owns it
            self.overlap.setdefault(ev.worker, (ev.now_s, ev.gpus))
        self.router.add(ev.worker, ev.role, ev.rate)
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
        while q:
            t = self.trajs.get(q.popleft())
            if t is not None and t.state is TrajState.WAITING:
                self._route(t)
                if t.state is TrajState.WAITING:
                    # no worker for it, so none for the rest either (every turn is routed by the same rule, on
                    # the same load): they wait, in order, without a routing pass each (a jsq cap is hit per turn)
                    self.waiting.extend(q)
                    return

    def _leave_first(self, t: Traj) -> None:
        """`t` stops being a turn in flight on its first worker (jsq's load)."""
        if t.state is TrajState.FIRST and t.worker is not None:
            n = self._on_first.get(t.worker, 0)
            if n > 1:
                self._on_first[t.worker] = n - 1
            else:
                self._on_first.pop(t.worker, None)

    def _route(self, t: Traj) -> None:
        self._touched(t.tid)
        self._leave_first(t)
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
        self._on_first[w] = self._on_first.get(w, 0) + 1
        mv = self.min_weight_version(t)
        if t.gen_in_turn:
            self._emit(Resubmit(t.tid, w, t.turn, t.gen_in_turn, mv))
        else:
            self._emit(RouteTurn(t.tid, w, t.turn, mv))

    def _first_load(self) -> dict[int, int]:
        """Turns in flight on each colocated or prefill worker (routed there, not yet back), kept as
        trajectories enter and leave FIRST: no pass over every trajectory per turn."""
        return self._on_first

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
        self._leave_first(t)
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
        self._leave_first(t)
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
        if t is not None and ev.failed:  # at reset or after a turn: a failed trajectory, never a reward
            self.failed_trajectories += 1
            if ev.final:
                self._give_up(t, ev.now_s, f"failed: {ev.failed}")
            else:
                self._restart(t, ev.now_s, f"failed: {ev.failed}", stale=False)
            return
        if t is None or t.state is not TrajState.ENV:
            return
        t.env_time_s += ev.env_time_s
        t.prefilled += t.pre_in_turn
        self._emit(
            Telemetry(
                tm.turn(
                    time_s=ev.now_s,
                    job=self.cfg.job,
                    step=t.step,
                    trajectory=t.tid,
                    turn=t.turn,
                    new_prompt_tokens=t.pre_in_turn,
                    generated_tokens=t.gen_in_turn,
                    env_time_s=ev.env_time_s,
                    duration_s=ev.now_s - t.turn_start_s,
                )
            )
        )
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

    def _give_up(self, t: Traj, now: float, why: str) -> None:
        """`t`'s failure is final: it leaves its step's batch with no replacement, so the step finishes
        without it (its group trains with the members it has left, `_drop_small_groups`)."""
        if t.state is TrajState.DECODE and t.worker is not None:
            self.router.decode_done(t.worker)
        self._leave_first(t)
        self.router.unhome(t.tid)
        del self.trajs[t.tid]
        self._touched(t.tid)
        st = self.steps[t.step]
        st.trajectories.remove(t.tid)
        st.given_up += 1
        st.remaining -= 1
        self._emit(Abort(t.tid, why, None))
        self._emit(Progress(st.step, st.remaining, self.cfg.batch_size))
        if st.remaining == 0:
            self._batch_complete(st, now)

    def _drop_small_groups(self, st: StepState) -> None:
        """A group that lost members and kept fewer than 2 leaves the batch: GRPO has no advantage to
        learn from one member (a job whose groups are of one member keeps them)."""
        keep = min(2, self.cfg.group_size)
        groups: dict[int, list[str]] = {}
        for tid in st.trajectories:
            groups.setdefault(self.trajs[tid].group, []).append(tid)
        for members in groups.values():
            if len(members) < keep:
                st.dropped_groups += 1
                st.dropped += members
        lost = self.cfg.batch_size // self.cfg.group_size - len(groups)  # groups whose every member gave up
        st.dropped_groups += max(0, lost)
        if st.dropped:
            out = set(st.dropped)
            st.trajectories = [tid for tid in st.trajectories if tid not in out]

    def _stale(self, t: Traj) -> bool:
        """Batch j is trained from weights j: data from weights older than j − α is too stale."""
        return t.step - self._steps_done(t.min_version) > self.cfg.max_staleness

    def _restart(self, t: Traj, now: float, why: str, *, stale: bool) -> None:
        """Abort `t` and start a replacement on the same task (same group, same batch position)."""
        if t.state is TrajState.DECODE and t.worker is not None:
            self.router.decode_done(t.worker)
        self._leave_first(t)
        t.state = TrajState.ABORTED
        self._touched(t.tid)
        self.router.unhome(t.tid)
        st = self.steps[t.step]
        if stale:
            self.stale_aborted += 1
            st.stale_aborted += 1
            why = (
                f"stale: step {t.step} has data from weights v{t.min_version} (max staleness {self.cfg.max_staleness})"
            )
        n = self._replacements.get(t.index, 0) + 1
        self._replacements[t.index] = n
        ref = TrajectoryRef(f"s{t.step}-t{t.index}-r{n}", t.group, t.index)
        st.trajectories[st.trajectories.index(t.tid)] = ref.trajectory
        self.trajs[ref.trajectory] = Traj(ref.trajectory, t.step, t.group, t.index, self.version, self.version, now)
        self._touched(ref.trajectory)
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
        # the workload figures are of every finished trajectory (a dropped group's ran too); the batch's of the
        # trained ones. A step whose every member gave up finished none: its record is of an empty batch
        trajs = [self.trajs[tid] for tid in st.trajectories]
        ran = trajs + [self.trajs[tid] for tid in st.dropped] or [Traj("", st.step, 0, 0, 0, 0, st.start_s)]
        n = max(1, len(trajs))
        turns = [t.turn for t in ran]
        n_turns = max(1, sum(turns))
        last = max(ran, key=lambda t: t.end_s)
        gen = sum(t.gen_time_s for t in ran)
        env = sum(t.env_time_s for t in ran)
        dec = sum(min(t.decode_time_s, t.gen_time_s) for t in ran)
        cfg = self.configuration
        return tm.step(
            time_s=now,
            job=self.cfg.job,
            step=st.step,
            batch_size=self.cfg.batch_size,  # the slots the step ran (the tracker's B); trained: less the two below
            turns_max=max(turns),
            turns_mean=sum(turns) / len(ran),
            new_prompt_tokens_mean=sum(t.prefilled for t in ran) / n_turns,
            generated_tokens_mean=sum(t.generated for t in ran) / n_turns,
            env_time_total_s=last.env_time_s,
            active_decode_fraction=dec / (gen + env) if gen + env > 0 and dec > 0 else 1.0,
            makespan_s=now - st.start_s,
            predicted_makespan_s=st.predicted_makespan_s,
            predicted_at_start_s=st.predicted_at_start_s,
            mode=str(cfg.mode) if cfg else "",
            n_prefill=cfg.n_prefill if cfg else 0,
            n_decode=cfg.n_decode if cfg else 0,
            n_colocated=cfg.n_colocated if cfg else 0,
            generated_tokens_total=st.generated_tokens,
            train_tokens=sum(t.prompt + t.generated for t in trajs),
            reward_mean=sum(t.reward for t in trajs) / n,
            borrowed_gpu_s=st.borrowed_gpu_s,
            stale_aborted=st.stale_aborted,
            interruptions=st.interruptions,
            given_up=st.given_up,
            dropped_groups=st.dropped_groups,
        )

    def checkpoint(self) -> dict[str, Any]:
        """What the loop must not lose, as JSON (`state.encode`)."""
        return encode(self)

    @classmethod
    def restore(cls, config: LoopConfig, data: dict[str, Any]) -> RolloutLoop:
        """Rebuild a loop from `checkpoint()`. Workers are learnt again from WorkerReady events; on
        `Start`, unfinished turns are routed again from their kept progress."""
        loop = cls(config)
        decode_into(loop, data)
        for t in loop.trajs.values():  # what jsq counts as in flight (the Start that follows routes them again)
            if t.state is TrajState.FIRST and t.worker is not None:
                loop._on_first[t.worker] = loop._on_first.get(t.worker, 0) + 1
        return loop


_HANDLERS: dict[type, Any] = {
    Start: RolloutLoop._on_start,
    Stop: RolloutLoop._on_stop,
    TrajectoryStarted: RolloutLoop._on_trajectory_started,
    Prefilled: RolloutLoop._on_prefilled,
    TurnGenerated: RolloutLoop._on_turn_generated,
    TurnInterrupted: RolloutLoop._on_turn_interrupted,
    EnvStepped: RolloutLoop._on_env_stepped,
    WorkerReady: RolloutLoop._on_worker_ready,
    WorkerGone: RolloutLoop._on_worker_gone,
    Admission: RolloutLoop._on_admission,
    ReturnConfirmed: RolloutLoop._on_return_confirmed,
    TrainingDone: RolloutLoop._on_training_done,
    WeightsPublished: RolloutLoop._on_weights_published,
    Decided: RolloutLoop._on_decided,
    Tick: RolloutLoop._on_tick,
}
