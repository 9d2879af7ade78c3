"""The RL loop's state machine: `cmds = loop.handle(event)` (the etcd/raft `Ready` pattern, docs/design.md §10).

`RolloutLoop` is the whole machine: the entry point and the step cycle, the trajectories' events (turns,
environment steps, restarts and final failures), the scheduler's feedback and the STEP record, on top of
`base.LoopBase` (the loop's records, admitting a step), `training.TrainingPhase` (the trainer handshake)
and `routing.Routing` (workers and routing).
"""

from __future__ import annotations

import math
from typing import Any

from controlplane.core import telemetry as tm
from controlplane.core.context import Signal
from controlplane.core.loop.base import LoopConfig
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
    ReturnConfirmed,
    ReturnOverlap,
    RouteDecode,
    Start,
    Stop,
    Telemetry,
    Tick,
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
from controlplane.core.loop.routing import Routing
from controlplane.core.loop.state import (
    DRIVER_RESTARTED,
    StepState,
    TrainerPhase,
    Traj,
    TrajState,
    decode_into,
    encode,
)
from controlplane.core.loop.training import TrainingPhase


# ==================================================================================== the loop
class RolloutLoop(TrainingPhase, Routing):
    """`cmds = loop.handle(event)`; the driver carries the commands out, in order."""

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
        trajectories keep their samples (they went to the trainer as they finished; those that finished
        after the checkpoint are `TrajectoryRecovered` before `Start`); unfinished ones restart on their
        task; the trainer handshake picks up where it was (its commands are idempotent)."""
        if self.rollout_active:
            for t in list(self.trajs.values()):
                if t.step == self.step and t.state not in (TrajState.DONE, TrajState.ABORTED):
                    self._restart(t, now, DRIVER_RESTARTED, stale=False)
        if self.trainer is TrainerPhase.RETURNING:
            self._emit(ReturnOverlap(self.tb_s + self.cfg.return_deadline_s, ()))
        elif self.trainer is TrainerPhase.TRAINING:
            self._emit(self._train_command())
        elif self.trainer is TrainerPhase.PUBLISHING:
            self._emit(PublishWeights(self.ready[0] + 1))

    def _on_stop(self, ev: Stop) -> None:
        self.stopped = True

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
        self._finish(t, ev.now_s)

    def _on_trajectory_recovered(self, ev: TrajectoryRecovered) -> None:
        """`t` finished before the driver restarted: its samples are durable at the trainer (acknowledged
        before the old driver counted it), so it counts as finished, as at its end (staleness checked), and
        is not run again. A trajectory done, aborted, or of a trained step is left as it is."""
        t = self._live(ev.trajectory)
        if t is None or t.step < self.trained_next:
            return
        if t.state is TrajState.DECODE and t.worker is not None:
            self.router.decode_done(t.worker)
        self._leave_first(t)
        t.worker = None
        if ev.weight_version is not None:
            t.min_version = min(t.min_version, ev.weight_version)
        t.reward = ev.reward
        t.turn = max(t.turn, ev.turns)  # (its tokens are not known here: the STEP record counts what it saw)
        if self._stale(t):
            self._restart(t, ev.now_s, "stale", stale=True)
            return
        self._finish(t, ev.now_s)

    def _finish(self, t: Traj, now: float) -> None:
        """`t` is done and its samples are at the trainer: one fewer to go in its step."""
        t.state = TrajState.DONE
        t.end_s = now
        self.router.unhome(t.tid)
        self.finished_trajectories += 1
        st = self.steps[t.step]
        st.remaining -= 1
        self._emit(Progress(st.step, st.remaining, self.cfg.batch_size))
        if st.remaining == 0:
            self._batch_complete(st, now)

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

    # ------------------------------------------------------------------ figures, checkpoint
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
            reward_std=_spread([t.reward for t in trajs]),
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


def _spread(values: list[float]) -> float:
    """The population standard deviation (0 for fewer than two values)."""
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


_HANDLERS: dict[type, Any] = {
    Start: RolloutLoop._on_start,
    Stop: RolloutLoop._on_stop,
    TrajectoryStarted: RolloutLoop._on_trajectory_started,
    Prefilled: RolloutLoop._on_prefilled,
    TurnGenerated: RolloutLoop._on_turn_generated,
    TurnInterrupted: RolloutLoop._on_turn_interrupted,
    EnvStepped: RolloutLoop._on_env_stepped,
    TrajectoryRecovered: RolloutLoop._on_trajectory_recovered,
    WorkerReady: RolloutLoop._on_worker_ready,
    WorkerGone: RolloutLoop._on_worker_gone,
    Admission: RolloutLoop._on_admission,
    ReturnConfirmed: RolloutLoop._on_return_confirmed,
    TrainingDone: RolloutLoop._on_training_done,
    WeightsPublished: RolloutLoop._on_weights_published,
    Decided: RolloutLoop._on_decided,
    Tick: RolloutLoop._on_tick,
}
