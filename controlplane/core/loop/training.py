"""The trainer handshake of the RL loop: Training Begin → return every borrowed overlap worker (with a
deadline) → train once the return is confirmed → publish weights → Training Finished, one batch at a
time and in order; a batch with nothing to train is skipped without a new version."""

from __future__ import annotations

from controlplane.core import telemetry as tm
from controlplane.core.context import Signal
from controlplane.core.loop.base import LoopBase
from controlplane.core.loop.messages import (
    EmitSignal,
    PublishWeights,
    ReturnConfirmed,
    ReturnOverlap,
    Telemetry,
    Train,
    TrainingDone,
    WeightsPublished,
)
from controlplane.core.loop.state import TrainerPhase

STEP_RECORDS_KEPT = 16  # final steps whose records a loop (and its checkpoint) keeps (`_forget_old_steps`)


class TrainingPhase(LoopBase):
    """The handlers of the trainer handshake (`ReturnConfirmed`, `TrainingDone`, `WeightsPublished`)."""

    def _maybe_train(self, now: float) -> None:
        if self.trainer is not TrainerPhase.IDLE or not self.ready or self.ready[0] != self.trained_next:
            return
        if not self.steps[self.ready[0]].trajectories:
            self._skip_update(now)
            return
        self.trainer = TrainerPhase.RETURNING
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
        if self.trainer is TrainerPhase.IDLE and self.training_active:  # skipped right after an update
            self.training_active = False
            self._emit(EmitSignal(Signal.TRAINING_FINISHED, self.remaining))
        self._maybe_start_step(now)

    def _on_return_confirmed(self, ev: ReturnConfirmed) -> None:
        if self.trainer is not TrainerPhase.RETURNING:
            return
        self._account_overlap(ev.now_s, drop=True)
        self.return_latency_s = ev.now_s - self.tb_s
        if self.return_latency_s > self.cfg.return_deadline_s + 1e-9:
            self.deadline_misses += 1
        self.trainer = TrainerPhase.TRAINING
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
        if self.trainer is not TrainerPhase.TRAINING or not self.ready or ev.step != self.ready[0]:
            return
        self.trainer = TrainerPhase.PUBLISHING
        self.loss, self.missing = ev.loss, ev.missing
        self._emit(PublishWeights(ev.step + 1 - len(self.skipped)))

    def _on_weights_published(self, ev: WeightsPublished) -> None:
        if self.trainer is not TrainerPhase.PUBLISHING or ev.version != self.ready[0] + 1 - len(self.skipped):
            self.version = max(self.version, ev.version)
            return
        j = self.ready.popleft()
        self.version = ev.version
        self.trained_next = j + 1
        self.trainer = TrainerPhase.IDLE
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
