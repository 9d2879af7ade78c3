"""The simulated world under the core loop: GPU units, their engines, KV links, environments and
the execution of transition plans in virtual time.

What is modelled (finer than the predictor's closed forms):
- every worker's continuous batching at iteration level (`core.batching.IterationScheduler`), chunked prefill
  interfering with decode when colocated, serialised KV links and decode-pool KV limits;
- prefix caches: a trajectory's next turn reuses its cached context on its home worker unless KV
  pressure evicted it (`submit_first`), or the worker's memory was re-partitioned;
- elastic GPUs: preparation in the background, then admission-paused finalisation; preemption
  takes a unit at once (its requests come back as interruptions, partial tokens kept);
- overlap (training-GPU) workers: activation when borrowed, deactivation when returned;
- transitions from core placement (`core.placement.place`): removals, drain-then-flip role
  changes, additions, each with Table 3 costs.

The world never decides: routing, the RL loop, signals and training live in `core.loop`; the world
only reports what happened (`sim.feed(event)`).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from controlplane.core import loop as lp
from controlplane.core import telemetry as tm
from controlplane.core.batching import EngineCosts, IterationScheduler, Request, prefill_records
from controlplane.core.placement import Inventory, Placement, Unit, lowest_free_slots
from controlplane.core.state import Pool, Role
from controlplane.core.profiles import Profile
from controlplane.core.telemetry import TelemetryRecord
from controlplane.core.workload import Trajectory
from controlplane.sim.scenario import Scenario


class Host(Protocol):
    """What the world needs from its driver (`cluster.Simulation`): the clock, the loop, the policy."""

    sc: Scenario
    profile: Profile
    costs: EngineCosts
    free: bool
    record_timeline: bool

    def push(self, t: float, kind: int, a: Any = None, b: Any = None) -> None: ...

    def feed(self, event: Any) -> None: ...

    def observe(self, record: TelemetryRecord) -> None: ...

    def unstable(self) -> None: ...

# heap event kinds handled by the world (ints keep heap tuples cheap); the Simulation owns the rest
EV_WAKE, EV_ENV, EV_KV, EV_PREP, EV_READY, EV_UNPAUSE, EV_RETURNED, EV_DRAIN_TIMEOUT = range(8)

# unit states
PREPARING, IDLE, PENDING, SERVING, DRAINING, INACTIVE, GONE = "preparing", "idle", "pending", "serving", "draining", "inactive", "gone"
_POOL = {"reserved": Pool.RESERVED, "elastic": Pool.ELASTIC, "overlap": Pool.TRAINING}


@dataclass(slots=True)
class Slot:
    """A unit (TP group of GPUs, G_w fixed for life) and its simulated engine."""

    sid: int
    pool: str  # reserved | elastic | overlap
    state: str
    worker: IterationScheduler
    role: Role | None = None
    wid: int | None = None  # the rollout worker's slot id while one is bound to this unit
    ready_at: float = 0.0
    after_drain: tuple[str, Role | None] | None = None  # (next state, next role) once drained
    borrowed_since: float | None = None

    def next_role(self) -> Role | None:
        """The role once in-flight transitions complete (None: not in service)."""
        if self.state in (SERVING, PENDING):
            return self.role
        if self.state == DRAINING and self.after_drain is not None and self.after_drain[0] == SERVING:
            return self.after_drain[1]
        return None


class World:
    def __init__(self, sim: Host) -> None:
        self.sim = sim
        sc = sim.sc
        self.tp = sc.cluster.tp
        self.costs = sim.costs
        self.reconf = sim.profile.reconfig
        self.free = sim.free
        self.kv_cap_tokens = int(sim.profile.hbm_kv_capacity // sim.profile.kv_bytes_per_token)
        self.kv_bytes = sim.profile.kv_bytes_per_token
        self.bw = sim.profile.bandwidth
        self.prefix_reuse = sc.workload.prefix_reuse
        self.push = sim.push
        self.feed: Callable[[Any], None] = sim.feed
        self.observe = sim.observe
        self.slots: dict[int, Slot] = {}
        self.by_wid: dict[int, Slot] = {}
        self.trajs: dict[str, Trajectory] = {}
        self.batch: list[Trajectory] = []  # the trajectories of the step in flight
        self.paused_until = 0.0
        self.elastic_target = 0
        self.overlap_wids: dict[int, int] = {}  # overlap unit sid -> its permanent worker slot
        self.taken_wids: set[int] = set()  # training workers' slots
        self.returning = False  # a ReturnOverlap is waiting for every overlap unit to be inactive
        self._kv: dict[str, Request] = {}  # prefilled requests whose KV just arrived, until the loop routes them
        # accounting
        self.transitions = 0
        self.borrowed_gpu_s = 0.0
        self.borrow_windows: list[tuple[float, float, int]] = []
        self.traj_generated = 0
        self.timeline: list[dict[str, Any]] = []
        self._iter_sample = 0
        # Prefix caches are flushed when workers load new weights (SGLang flushes its radix cache in
        # update_weights; RLBoost's patch flush_cache=True): every cached prefix of an older epoch is gone
        self.cache_epoch = 0
        self.flush_on_update = sc.engine.flush_cache_on_weight_update

    # ================================================================== units and capacity
    def new_unit(self, pool: str, state: str) -> Slot:
        free = [s for s in self.slots.values() if s.state == GONE and s.pool == pool]
        if free:
            slot = free[0]
            slot.state = state
            slot.worker.gen += 1
            slot.worker.version += 1
            slot.role = None
            return slot
        sid = len(self.slots)
        w = IterationScheduler(sid, pool, Role.COLOCATED, self.costs, chunk_tokens=self.sim.sc.engine.chunk_tokens,
                   kv_capacity=self.kv_cap_tokens, mixed_penalty=self.sim.sc.engine.mixed_prefill_penalty)
        slot = Slot(sid, pool, state, w)
        self.slots[sid] = slot
        return slot

    def add_training_units(self, n: int) -> None:
        """Training GPU groups: a training worker and an (inactive) overlap rollout worker per unit,
        numbered as the live control plane numbers them (training slot, then overlap slot)."""
        for _ in range(n):
            slot = self.new_unit("overlap", INACTIVE)
            used = self.taken_wids | set(self.overlap_wids.values())
            train, ovl = lowest_free_slots(2, used)
            self.taken_wids.add(train)
            self.overlap_wids[slot.sid] = ovl
            slot.wid = ovl
            self.by_wid[ovl] = slot

    def set_elastic(self, t: float, total_gpus: int, initial: bool = False) -> None:
        """Bring the number of elastic units (incl. preparing) to what the trace grants."""
        want = max(0, total_gpus - self.sim.sc.cluster.reserved_gpus) // self.tp
        self.elastic_target = want
        live = [s for s in self.slots.values() if s.pool == "elastic" and s.state != GONE]
        if len(live) < want:
            for _ in range(want - len(live)):
                if initial or self.free:
                    self.new_unit("elastic", IDLE)
                else:
                    slot = self.new_unit("elastic", PREPARING)
                    slot.ready_at = t + self.reconf.inter_scale_preparation_s
                    self.push(slot.ready_at, EV_PREP, slot.sid, slot.worker.gen)
        elif len(live) > want:
            # Preemption: preparing units go first, then idle ones, then the most recently joined.
            order = {PREPARING: 0, IDLE: 1, PENDING: 2, DRAINING: 3, SERVING: 4}
            for s in sorted(live, key=lambda s: (order.get(s.state, 5), -s.sid))[: len(live) - want]:
                self.preempt(s, t)

    def preempt(self, slot: Slot, t: float) -> None:
        was = slot.state
        self.leave_serving(slot, t, "preempt")
        slot.state = GONE
        self.evict(slot, t, keep_cache=False)
        self.unbind(slot)
        slot.role = None
        slot.after_drain = None
        slot.worker.gen += 1
        if was in (SERVING, PENDING, DRAINING):
            self.sim.unstable()
        self.log(t, "preempt")

    def on_prepared(self, sid: int, gen: int) -> bool:
        slot = self.slots[sid]
        if slot.state != PREPARING or slot.worker.gen != gen:
            return False
        slot.state = IDLE
        return True

    def capacity_key(self) -> tuple[int, int]:
        ready = sum(1 for s in self.slots.values() if s.pool != "overlap" and s.state in (IDLE, PENDING, SERVING, DRAINING))
        return ready, sum(1 for s in self.slots.values() if s.pool == "overlap" and s.state in (PENDING, SERVING))

    def unbind(self, slot: Slot) -> None:
        """A dedicated unit's worker stops: its slot id is free for the next new worker."""
        if slot.pool != "overlap" and slot.wid is not None:
            self.by_wid.pop(slot.wid, None)
            slot.wid = None

    # ================================================================== placement
    def inventory(self, training_active: bool) -> Inventory:
        units: list[Unit] = []
        taken = set(self.taken_wids)
        for s in self.slots.values():
            nxt = s.next_role()
            if s.pool == "overlap":
                if s.state == DRAINING and nxt is None:  # being returned: not borrowable until inactive
                    units.append(Unit(s.sid, Pool.TRAINING, s.wid, None, leaving=True))
                    continue
                units.append(Unit(s.sid, Pool.TRAINING, s.wid, nxt, busy=s.state != SERVING,
                                  inflight=s.worker.load() if nxt is not None else 0))
            elif s.state in (IDLE, PENDING, SERVING) or nxt is not None:
                units.append(Unit(s.sid, _POOL[s.pool], s.wid, nxt, busy=s.state != SERVING and nxt is not None,
                                  inflight=s.worker.load() if nxt is not None else 0))
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
        self.feed(lp.WorkerReady(t, slot.wid, slot.role, overlap=slot.pool == "overlap", gpus=self.tp))  # type: ignore[arg-type]

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
        self.observe(tm.toggle(time_s=t, worker=slot.wid, activation_s=0.0 if free else self.reconf.intra_scale_activation_s,
                               return_s=delay, duration_s=(0.0 if free else self.reconf.toggle_s)))

    def return_borrowed(self, t: float) -> int:
        """Training Begin: every borrowed (or activating) overlap worker goes back at once, before the
        re-plan (as the live control plane parks them in the Training Begin transaction). Returns how many."""
        n = 0
        for s in list(self.slots.values()):
            if s.pool == "overlap" and (s.state in (SERVING, PENDING) or (s.state == DRAINING and s.after_drain is not None)):
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

    # ================================================================== trajectories and requests
    def start_batch(self, cmd: lp.StartStep, batch: list[Trajectory], t: float) -> None:
        self.batch = batch
        for ref, traj in zip(cmd.trajectories, batch):
            traj.tid = ref.trajectory
            self.trajs[traj.tid] = traj
        for traj in batch:
            traj.start_s = t
            self.begin_turn(traj, t)
            self.feed(lp.TrajectoryStarted(t, traj.tid, traj.turns[0].new_prompt_tokens))

    def abort(self, cmd: lp.Abort, t: float) -> None:
        """A trajectory dropped by the loop (staleness): the same task starts again from its first turn."""
        old = self.trajs.pop(cmd.trajectory)
        old.done = True
        self.unhome(old)
        if cmd.replacement is not None:
            new = Trajectory(tid=cmd.replacement.trajectory, step=old.step, group=old.group, turns=old.turns)
            self.trajs[new.tid] = new
            self.batch[self.batch.index(old)] = new
            new.start_s = t
            self.begin_turn(new, t)
            self.feed(lp.TrajectoryStarted(t, new.tid, new.turns[0].new_prompt_tokens))

    def begin_turn(self, traj: Trajectory, t: float) -> None:
        spec = traj.turns[traj.turn]
        self.grow(traj, spec.new_prompt_tokens)
        traj.prompt_total += spec.new_prompt_tokens
        traj.turn_start_s = t

    def submit_first(self, tid: str, wid: int, t: float) -> None:
        """RouteTurn / Resubmit: the turn's prompt (and any kept prefix) to a colocated or prefill worker."""
        traj = self.trajs[tid]
        slot = self.by_wid.get(wid)
        if slot is None or slot.state != SERVING:  # it stopped serving before the request got there
            self.feed(lp.TurnInterrupted(t, tid, wid))
            return
        w = slot.worker
        if traj.home != slot.sid:
            self.unhome(traj)
            traj.home = slot.sid
            w.homed_ctx += traj.context
        cached = traj.cached_len if (traj.cached_on == slot.sid and traj.cached_gen == w.gen
                                     and traj.cached_epoch == self.cache_epoch) else 0
        if cached:
            # Prefix cache under KV pressure: running requests pin their KV; the cached prefixes of
            # the trajectories homed here share what is left (LRU over many waiting trajectories
            # keeps about that fraction of each resident).
            free_kv = w.kv_capacity - w.kv_used
            demand = max(1, w.homed_ctx)
            resident = 1.0 if demand <= free_kv else max(0.0, free_kv / demand)
            cached = min(int(cached * self.prefix_reuse * resident), traj.context)
        req = Request(traj, traj.context - cached, cached, traj.context,
                      traj.turns[traj.turn].generated_tokens - traj.generated_in_turn, arrive_s=t)
        traj.where = slot.sid
        traj.prefilled_in_turn += req.compute
        traj.prefilled_total += req.compute
        w.submit_prompt(req)
        self.kick(slot, t)

    def submit_decode(self, cmd: lp.RouteDecode, t: float) -> None:
        req = self._kv.pop(cmd.trajectory)
        slot = self.by_wid.get(cmd.worker)
        if slot is None or slot.state != SERVING:
            self.feed(lp.TurnInterrupted(t, cmd.trajectory, cmd.worker))
            return
        req.arrive_s = t
        req.traj.where = slot.sid
        slot.worker.submit_decode(req)
        self.kick(slot, t)

    def unhome(self, traj: Trajectory) -> None:
        if traj.home is not None and traj.home in self.slots:
            old = self.slots[traj.home].worker
            old.homed_ctx = max(0, old.homed_ctx - traj.context)
        traj.home = None

    def grow(self, traj: Trajectory, tokens: int) -> None:
        traj.context += tokens
        if traj.home is not None:
            self.slots[traj.home].worker.homed_ctx += tokens

    def kick(self, slot: Slot, t: float) -> None:
        w = slot.worker
        if w.seg is None:
            end = w.plan(t)
            if end is not None:
                self.push(end, EV_WAKE, slot.sid, w.version)
        else:
            end = w.interrupt(t)
            if end is not None:
                w.version += 1
                self.push(end, EV_WAKE, slot.sid, w.version)

    def on_wake(self, sid: int, version: int, t: float) -> None:
        slot = self.slots.get(sid)
        if slot is None or slot.worker.version != version:
            return
        w = slot.worker
        prefilled, done, seg = w.finish()
        n = len(w.running) + len(done)
        observe = self.observe
        if seg.kind == "decode" or (seg.kind == "prefill" and w.role is Role.COLOCATED and n):
            self._iter_sample += 1
            if seg.k >= 16 or self._iter_sample % 16 == 0:  # a sample is plenty for the A, b fit
                observe(tm.decode_iteration(time_s=t, worker=slot.wid, running_batch=n,
                                            duration_s=seg.dt if seg.kind == "decode" else (seg.end_s - seg.t0 - seg.prefill_s) / seg.k))
        if seg.kind == "prefill":
            for rec in prefill_records(seg, time_s=t, worker=slot.wid):
                observe(rec)
        for req in done:
            self.turn_done(req, t, slot)
        for req in prefilled:  # prefill role: hand the KV to a decode worker
            start = max(t, w.link_free_s)
            dur = req.ctx0 * self.kv_bytes / self.bw
            w.link_free_s = start + dur
            req.traj.cached_on = slot.sid
            req.traj.cached_gen = w.gen
            req.traj.cached_epoch = self.cache_epoch
            req.traj.cached_len = req.ctx0
            req.traj.where = -1
            self.push(start + dur, EV_KV, req, (slot.sid, w.gen, slot.wid))
            observe(tm.kv_transfer(time_s=start + dur, worker=slot.wid, tokens=req.ctx0,
                                   kv_bytes=int(req.ctx0 * self.kv_bytes), duration_s=dur))
        if w.seg is not None or slot.worker is not w or slot.state in (GONE, INACTIVE):
            return  # re-planned by a nested kick or taken away meanwhile
        if slot.state == DRAINING and slot.after_drain is not None and not w.running and not w.pq and not w.joinq:
            self.drained(slot, t)
            return
        end = w.plan(t)
        if end is not None:
            self.push(end, EV_WAKE, slot.sid, w.version)
        elif slot.state == DRAINING and slot.after_drain is not None:
            self.drained(slot, t)

    def on_kv(self, req: Request, src: tuple[int, int, int], t: float) -> None:
        """The KV cache arrived: the loop picks the decode worker (or re-prefills if the sender vanished)."""
        sid, gen, wid = src
        traj = req.traj
        if self.slots[sid].worker.gen != gen:
            traj.where = None
            self.feed(lp.TurnInterrupted(t, traj.tid, wid, 0, req.compute))
            return
        self._kv[traj.tid] = req
        self.feed(lp.Prefilled(t, traj.tid, wid, req.compute))
        self._kv.pop(traj.tid, None)  # not picked up: the loop re-prefills

    def credit(self, traj: Trajectory, generated: int) -> None:
        traj.generated_in_turn += generated
        traj.generated_total += generated
        self.grow(traj, generated)
        self.traj_generated += generated

    def requeue(self, req: Request, generated: int, t: float, slot: Slot) -> None:
        """An interrupted request: keep its generated prefix; the loop resumes the rest elsewhere."""
        traj = req.traj
        self.credit(traj, generated)
        traj.interruptions += 1
        traj.where = None
        wid = slot.wid if slot.wid is not None else -1
        prefilled = 0 if slot.role is Role.DECODE else req.compute  # a decode request's prefill was counted
        dec = max(0.0, t - req.join_s) if req.join_s >= 0 else 0.0
        req.join_s = -1.0
        if traj.generated_in_turn >= traj.turns[traj.turn].generated_tokens:
            self.feed(lp.TurnGenerated(t, traj.tid, wid, generated, prefilled, decode_s=dec))
            self.complete_turn(traj, t)
        else:
            self.feed(lp.TurnInterrupted(t, traj.tid, wid, generated, prefilled, decode_s=dec))

    def evict(self, slot: Slot, t: float, keep_cache: bool) -> None:
        w = slot.worker
        for req, g in w.evict(t):
            self.requeue(req, g, t, slot)
        if not keep_cache:
            w.gen += 1

    def turn_done(self, req: Request, t: float, slot: Slot) -> None:
        traj = req.traj
        self.credit(traj, req.remaining)
        if slot.role is Role.COLOCATED:
            traj.cached_on = slot.sid
            traj.cached_gen = slot.worker.gen
            traj.cached_epoch = self.cache_epoch
            traj.cached_len = traj.context
        traj.where = None
        dec = max(0.0, t - req.join_s) if req.join_s >= 0 else 0.0
        self.feed(lp.TurnGenerated(t, traj.tid, slot.wid if slot.wid is not None else -1, req.remaining,
                                   req.compute if slot.role is Role.COLOCATED else 0, decode_s=dec))
        self.complete_turn(traj, t)

    def complete_turn(self, traj: Trajectory, t: float) -> None:
        """The environment runs the turn's tool call; the last turn ends the trajectory."""
        spec = traj.turns[traj.turn]
        traj.turn += 1
        traj.generated_in_turn = 0
        traj.prefilled_in_turn = 0
        if traj.turn >= len(traj.turns):
            traj.done = True
            traj.end_s = t
            self.unhome(traj)
            self.feed(lp.EnvStepped(t, traj.tid, 0.0, True, 0.0))
            return
        traj.env_time_s += spec.env_latency_s
        self.push(t + spec.env_latency_s, EV_ENV, traj)

    def on_env(self, traj: Trajectory, t: float) -> None:
        if traj.done or self.trajs.get(traj.tid) is not traj:
            return  # aborted meanwhile
        self.begin_turn(traj, t)
        self.feed(lp.EnvStepped(t, traj.tid, traj.turns[traj.turn - 1].env_latency_s, False,
                                observation_tokens=traj.turns[traj.turn].new_prompt_tokens))

    # ================================================================== bookkeeping
    def log(self, t: float, why: str) -> None:
        if not self.sim.record_timeline:
            return
        row: dict[str, Any] = {"t": t, "why": why, "prefill": 0, "decode": 0, "colocated": 0, "borrowed": 0,
                               "transitioning": 0,
                               "available_gpus": self.sim.sc.cluster.reserved_gpus + self.elastic_target * self.tp}
        for s in self.slots.values():
            if s.state == SERVING and s.role is not None:
                row[str(s.role)] += 1
                if s.pool == "overlap":
                    row["borrowed"] += 1
            elif s.state in (PENDING, DRAINING) and s.pool != "overlap" or (s.pool == "overlap" and s.state == PENDING):
                row["transitioning"] += 1
        self.timeline.append(row)

    def close_borrows(self, end: float) -> None:
        for s in self.slots.values():
            if s.borrowed_since is not None:
                self.borrowed_gpu_s += (end - s.borrowed_since) * self.tp
                self.borrow_windows.append((s.borrowed_since, end, s.sid))

