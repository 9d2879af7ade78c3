"""The simulated world's transitions: a placement's plan executed in virtual time, with Table 3's costs.

Removals (overlap workers returned, dedicated ones drained to idle), drain-then-flip role changes,
additions (admission-paused finalisation for a joining group), and the return of every borrowed overlap
worker at Training Begin. What happened is reported to the loop (`WorkerReady`, `WorkerGone`,
`Admission`, `ReturnConfirmed`).
"""

from __future__ import annotations

from controlplane.core import loop as lp
from controlplane.core import telemetry as tm
from controlplane.core.placement import Inventory, Placement, Unit
from controlplane.core.state import Pool, Role
from controlplane.sim.units import (
    _POOL,
    DRAINING,
    EV_DRAIN_TIMEOUT,
    EV_READY,
    EV_RETURNED,
    EV_UNPAUSE,
    IDLE,
    INACTIVE,
    PENDING,
    SERVING,
    Slot,
    WorldState,
)


class Transitions(WorldState):
    """Placement plans carried out on the world's units."""

    def inventory(self, training_active: bool) -> Inventory:
        units: list[Unit] = []
        taken = set(self.taken_wids)
        mixed = self.mixed

        def hw(s: Slot) -> str:
            return s.hardware if mixed else ""  # one hardware: untyped units, as before

        for s in self.slots.values():
            nxt = s.next_role()
            if s.pool == "overlap":
                if s.lent:  # serving another job's rollout (multi-job): not this job's to borrow, its slot id kept
                    if s.wid is not None:
                        taken.add(s.wid)
                    continue
                if s.state == DRAINING and nxt is None:  # being returned: not borrowable until inactive
                    units.append(Unit(s.sid, Pool.TRAINING, s.wid, None, leaving=True, hardware=hw(s)))
                    continue
                units.append(
                    Unit(
                        s.sid,
                        Pool.TRAINING,
                        s.wid,
                        nxt,
                        busy=s.state != SERVING,
                        inflight=s.worker.load() if nxt is not None else 0,
                        hardware=hw(s),
                    )
                )
            elif s.state in (IDLE, PENDING, SERVING) or nxt is not None:
                units.append(
                    Unit(
                        s.sid,
                        _POOL[s.pool],
                        s.wid,
                        nxt,
                        busy=s.state != SERVING and nxt is not None,
                        inflight=s.worker.load() if nxt is not None else 0,
                        hardware=hw(s),
                    )
                )
            elif s.wid is not None:
                taken.add(s.wid)  # draining to idle: its worker still holds the slot id
        return Inventory(tuple(units), frozenset(taken), None, training_active)

    def execute(self, p: Placement, t: float, free: bool) -> bool:
        """Apply a placement's plan in virtual time; False if there is nothing to do."""
        plan = p.plan
        if not plan.add and not plan.remove and not plan.reassign:
            return False
        if not any(s.state in (SERVING, PENDING, DRAINING) for s in self.slots.values()):
            free = True  # the initial configuration: the cluster starts configured
        for wid, unit in p.new_workers.items():
            slot = self.slots[unit.key]  # type: ignore[index]
            slot.wid = wid
            self.by_wid[wid] = slot
        self.transitions += 1
        # 1) removals: overlap workers are returned, dedicated ones drained to idle
        for wid in plan.remove:
            slot = self.by_wid[wid]
            if slot.pool == "overlap":
                slot.after_drain = None
                self.return_overlap(slot, t, free)
            elif slot.state == DRAINING:
                slot.after_drain = (IDLE, None)  # already draining: it goes idle instead
            else:
                self.drain(slot, t, (IDLE, None), free)
        # 2) role changes of survivors: drain, then flip
        for wid, role in plan.reassign.items():
            slot = self.by_wid[wid]
            if slot.state == DRAINING:
                slot.after_drain = (SERVING, role)  # already draining: flip to the new role instead
            else:
                self.drain(slot, t, (SERVING, role), free)
        # 3) additions
        fin = 0.0 if free else self.reconf.inter_scale_finalisation_s
        any_inter = False
        for wid, role in plan.add.items():
            slot = self.by_wid[wid]
            slot.role = role
            slot.after_drain = None
            if slot.pool == "overlap":
                delay = 0.0 if free else self.reconf.intra_scale_activation_s
                if slot.borrowed_since is None:
                    slot.borrowed_since = t
            else:
                delay = fin
                any_inter = any_inter or fin > 0
            self.leave_serving(slot, t, "stop")
            slot.state = PENDING
            slot.worker.role = role
            slot.ready_at = t + delay
            slot.worker.version += 1
            self.push(t + delay, EV_READY, slot.sid, slot.worker.version)
        if any_inter:
            # atomic finalisation: new-request admission pauses while the group is admitted
            if t >= self.paused_until - 1e-9:
                self.feed(lp.Admission(t, False))
            self.paused_until = max(self.paused_until, t + fin)
            self.push(self.paused_until, EV_UNPAUSE)
        self.log(t, "transition")
        return True

    def drain(self, slot: Slot, t: float, then: tuple[str, Role | None], free: bool) -> None:
        """Stop admitting to `slot`; queued prompts go back to the router now, running decodes finish."""
        if slot.state == PENDING:  # not serving yet: apply directly
            slot.worker.version += 1
            self.finish_transition(slot, then, t, free)
            return
        self.leave_serving(slot, t, "drain")
        slot.state = DRAINING
        slot.after_drain = then
        w = slot.worker
        queued = list(w.pq) + list(w.joinq)
        w.pq.clear()
        w.joinq.clear()
        for req in queued:
            self.requeue(req, 0, t, slot)
        if free:
            for req, g in w.evict(t):
                self.requeue(req, g, t, slot)
        if w.idle() and not w.running:
            self.drained(slot, t, free)
        else:
            self.push(t + self.sim.sc.engine.drain_timeout_s, EV_DRAIN_TIMEOUT, slot.sid, w.gen)

    def on_drain_timeout(self, sid: int, gen: int, t: float) -> None:
        slot = self.slots[sid]
        if slot.state == DRAINING and slot.after_drain is not None and slot.worker.gen == gen:
            # the rest is interrupted; partial trajectories resume elsewhere
            self.evict(slot, t, keep_cache=False)
            self.drained(slot, t)

    def drained(self, slot: Slot, t: float, free: bool | None = None) -> None:
        then = slot.after_drain or (IDLE, None)
        slot.after_drain = None
        self.finish_transition(slot, then, t, self.free if free is None else free)

    def finish_transition(self, slot: Slot, then: tuple[str, Role | None], t: float, free: bool) -> None:
        state, role = then
        w = slot.worker
        if state == SERVING and role is not None:
            if role != slot.role:
                w.gen += 1  # a role flip re-partitions memory: the prefix cache is gone
            slot.role = role
            w.role = role
            slot.state = PENDING
            delay = 0.0 if free else self.reconf.role_change_s(0.0)
            w.version += 1
            self.push(t + delay, EV_READY, slot.sid, w.version)
        else:
            slot.state = IDLE
            slot.role = None
            self.unbind(slot)
        self.log(t, "drained")

    def on_ready(self, sid: int, version: int, t: float) -> None:
        slot = self.slots[sid]
        if slot.state != PENDING or slot.worker.version != version or slot.wid is None:
            return
        slot.state = SERVING
        slot.worker.serving = True
        self.log(t, "ready")
        rate = self.rates.get(slot.hardware, 1.0)  # {} on one chip type: every rate 1
        self.feed(lp.WorkerReady(t, slot.wid, slot.role, overlap=slot.pool == "overlap", gpus=self.tp, rate=rate))  # type: ignore[arg-type]

    def leave_serving(self, slot: Slot, t: float, why: str) -> None:
        if slot.worker.serving and slot.wid is not None:
            self.feed(lp.WorkerGone(t, slot.wid, why))
        slot.worker.serving = False

    def return_overlap(self, slot: Slot, t: float, free: bool) -> None:
        """Mandatory return of a borrowed training-GPU worker; partial trajectories are kept."""
        self.leave_serving(slot, t, "return")
        slot.state = DRAINING
        self.evict(slot, t, keep_cache=False)
        slot.role = None
        slot.worker.version += 1
        delay = 0.0 if free else self.reconf.intra_scale_deactivation_s
        self.push(t + delay, EV_RETURNED, slot.sid, slot.worker.version)
        since = slot.borrowed_since if slot.borrowed_since is not None else t
        self.borrowed_gpu_s += (t + delay - since) * self.tp
        self.borrow_windows.append((since, t + delay, slot.sid))
        slot.borrowed_since = None
        self.observe(
            tm.toggle(
                time_s=t,
                worker=slot.wid,
                activation_s=0.0 if free else self.reconf.intra_scale_activation_s,
                return_s=delay,
                duration_s=(0.0 if free else self.reconf.toggle_s),
            )
        )

    def return_borrowed(self, t: float) -> int:
        """Training Begin: every borrowed (or activating) overlap worker goes back at once, before the
        re-plan (as the live control plane parks them in the Training Begin transaction). Returns how many."""
        n = 0
        for s in list(self.slots.values()):
            if s.pool == "overlap" and (
                s.state in (SERVING, PENDING) or (s.state == DRAINING and s.after_drain is not None)
            ):
                s.after_drain = None
                self.return_overlap(s, t, self.free)
                n += 1
        return n

    def return_all_overlap(self, t: float) -> None:
        """ReturnOverlap: every borrowed (or activating) overlap worker goes back; confirm when all are inactive."""
        self.return_borrowed(t)
        self.returning = True
        self.confirm_return(t)

    def on_returned(self, sid: int, version: int, t: float) -> None:
        slot = self.slots[sid]
        if slot.worker.version != version:
            return
        slot.state = INACTIVE
        self.log(t, "returned")
        self.confirm_return(t)

    def confirm_return(self, t: float) -> None:
        if self.returning and all(s.state == INACTIVE for s in self.slots.values() if s.pool == "overlap"):
            self.returning = False
            self.feed(lp.ReturnConfirmed(t))

    def on_weights_published(self, t: float) -> None:
        if self.flush_on_update:
            self.cache_epoch += 1

    def on_unpause(self, t: float) -> None:
        if t >= self.paused_until - 1e-9:
            self.feed(lp.Admission(t, True))
