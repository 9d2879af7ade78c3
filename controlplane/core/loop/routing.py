"""Workers and routing in the RL loop: which workers serve (overlap workers only outside training),
admission, and routing a trajectory's turn through the PD router (`core.router`), queueing the turns
nothing can serve yet and, under RLBoost's jsq dispatch, counting each first worker's turns in flight."""

from __future__ import annotations

from collections import deque

from controlplane.core.loop.base import LoopBase
from controlplane.core.loop.messages import Admission, Resubmit, RouteTurn, WorkerGone, WorkerReady
from controlplane.core.loop.state import Traj, TrajState


class Routing(LoopBase):
    """The handlers of the serving set (`WorkerReady`, `WorkerGone`, `Admission`) and turn routing."""

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
