"""The simulated world's GPU units: their states, their engines, and the world's shared state.

A unit is a TP group of GPUs (G_w fixed for life) with its simulated engine (`core.batching`'s
iteration-level scheduler). Elastic units are prepared in the background and preempted at once;
overlap units (training GPUs) are activated when borrowed and deactivated when returned. `WorldState`
holds what the world's parts share (`sim.transitions`, `sim.serving`); `sim.world.World` is all of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from controlplane.core.batching import EngineCosts, IterationScheduler, Request
from controlplane.core.placement import lowest_free_slots
from controlplane.core.predictor import prior_serving_rates
from controlplane.core.profiles import Profile
from controlplane.core.state import Pool, Role
from controlplane.core.telemetry import TelemetryRecord
from controlplane.core.workload import Trajectory
from controlplane.sim.scenario import Scenario


class Host(Protocol):
    """What the world needs from its driver (`cluster.Simulation`): the clock, the loop, the policy."""

    sc: Scenario
    profile: Profile
    train_profile: Profile  # the training GPUs' chip (the overlap units')
    free: bool
    record_timeline: bool

    @property
    def costs(self) -> EngineCosts: ...  # read-only here, so the host's own cost type may be narrower

    @property
    def overlap_costs(self) -> EngineCosts: ...

    def costs_for(self, hardware: str) -> EngineCosts: ...

    def profile_for(self, hardware: str) -> Profile: ...

    @property
    def kv_link_scale(self) -> float: ...

    def push(self, t: float, kind: int, a: Any = None, b: Any = None) -> None: ...

    def feed(self, event: Any) -> None: ...

    def observe(self, record: TelemetryRecord) -> None: ...

    def unstable(self) -> None: ...


# heap event kinds handled by the world (ints keep heap tuples cheap); the Simulation owns the rest
EV_WAKE, EV_ENV, EV_KV, EV_PREP, EV_READY, EV_UNPAUSE, EV_RETURNED, EV_DRAIN_TIMEOUT = range(8)

# unit states
PREPARING, IDLE, PENDING, SERVING, DRAINING, INACTIVE, GONE = (
    "preparing",
    "idle",
    "pending",
    "serving",
    "draining",
    "inactive",
    "gone",
)
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
    hardware: str = ""  # its chip type (the units of a TP group are one node's: one type)
    lent: bool = False  # an overlap unit lent to another job's rollout (multi-job, `sim.multi`): not borrowable

    def next_role(self) -> Role | None:
        """The role once in-flight transitions complete (None: not in service)."""
        if self.state in (SERVING, PENDING):
            return self.role
        if self.state == DRAINING and self.after_drain is not None and self.after_drain[0] == SERVING:
            return self.after_drain[1]
        return None


class WorldState:
    """The world's state and its units (preparation, preemption, slot ids); the parts that act on requests
    and transitions are `sim.serving.Serving` and `sim.transitions.Transitions`."""

    def __init__(self, sim: Host) -> None:
        self.sim = sim
        sc = sim.sc
        self.tp = sc.cluster.tp
        self.costs = sim.costs
        self.reconf = sim.profile.reconfig
        self.free = sim.free
        self.kv_cap_tokens = int(sim.profile.hbm_kv_capacity // sim.profile.kv_bytes_per_token)
        self.kv_cap_tokens_overlap = int(sim.train_profile.hbm_kv_capacity // sim.train_profile.kv_bytes_per_token)
        self.kv_bytes = sim.profile.kv_bytes_per_token
        self.bw = sim.profile.bandwidth
        cl = sc.cluster
        self.mixed = cl.mixed  # units name their chip types (issue 23); else one hardware, as before
        self.rollout_hw = cl.hardware.upper()
        self.training_hw = (cl.training_hardware or cl.hardware).upper()
        self.elastic_hw = tuple(h.upper() for h in cl.elastic_hardware)
        # each chip's relative speed, which the sticky router homes trajectories by (as the control plane does)
        chips = tuple(sorted({self.rollout_hw, self.training_hw, *self.elastic_hw}))
        self.rates = prior_serving_rates(sc.model, chips, self.tp, sc.workload.max_length) if self.mixed else {}
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
        # an overlap unit is a group of training GPUs: its engine runs on the training chip
        ovl = pool == "overlap"
        costs = self.sim.overlap_costs if ovl else self.costs
        kv_cap = self.kv_cap_tokens_overlap if ovl else self.kv_cap_tokens
        hw = self.training_hw if ovl else self.rollout_hw
        if pool == "elastic" and self.elastic_hw:
            k = sum(1 for s in self.slots.values() if s.pool == "elastic")
            hw = self.elastic_hw[k % len(self.elastic_hw)]
            prof = self.sim.profile_for(hw)
            costs = self.sim.costs_for(hw)
            kv_cap = int(prof.hbm_kv_capacity // prof.kv_bytes_per_token)
        w = IterationScheduler(
            sid,
            pool,
            Role.COLOCATED,
            costs,
            chunk_tokens=self.sim.sc.engine.chunk_tokens,
            kv_capacity=kv_cap,
            mixed_penalty=self.sim.sc.engine.mixed_prefill_penalty,
        )
        slot = Slot(sid, pool, state, w, hardware=hw)
        self.slots[sid] = slot
        return slot

    def link_bw(self, src: Slot) -> float:
        """KV bandwidth of one hand-off from prefill unit `src`: its own profile's within one type; on a mixed
        pool the link to the decode pool's chip (the slowest one if decode spans several), bounded by the
        slower end (`profiles.link_bytes_per_s`)."""
        if not self.mixed:
            return self.bw * self.sim.kv_link_scale
        from controlplane.core.profiles import link_bytes_per_s

        dec = {s.hardware for s in self.slots.values() if s.role is Role.DECODE and s.state == "serving"}
        if not dec:
            dec = {src.hardware}
        return min(link_bytes_per_s(src.hardware, h, self.tp) for h in dec) * self.sim.kv_link_scale

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
        self.set_elastic_units(t, max(0, total_gpus - self.sim.sc.cluster.reserved_gpus) // self.tp, initial)

    def set_elastic_units(self, t: float, want: int, initial: bool = False) -> None:
        """Bring the number of elastic units (incl. preparing) to `want`: new ones prepare (weights load),
        surplus ones are preempted at once (their partial trajectories continue elsewhere)."""
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
        ready = sum(
            1 for s in self.slots.values() if s.pool != "overlap" and s.state in (IDLE, PENDING, SERVING, DRAINING)
        )
        return ready, sum(1 for s in self.slots.values() if s.pool == "overlap" and s.state in (PENDING, SERVING))

    def unbind(self, slot: Slot) -> None:
        """A dedicated unit's worker stops: its slot id is free for the next new worker."""
        if slot.pool != "overlap" and slot.wid is not None:
            self.by_wid.pop(slot.wid, None)
            slot.wid = None

    # ================================================================== defined by the other parts
    def leave_serving(self, slot: Slot, t: float, why: str) -> None:
        raise NotImplementedError  # sim.transitions

    def drained(self, slot: Slot, t: float, free: bool | None = None) -> None:
        raise NotImplementedError  # sim.transitions

    def evict(self, slot: Slot, t: float, keep_cache: bool) -> None:
        raise NotImplementedError  # sim.serving

    def requeue(self, req: Request, generated: int, t: float, slot: Slot) -> None:
        raise NotImplementedError  # sim.serving

    # ================================================================== bookkeeping
    def log(self, t: float, why: str) -> None:
        if not self.sim.record_timeline:
            return
        row: dict[str, Any] = {
            "t": t,
            "why": why,
            "prefill": 0,
            "decode": 0,
            "colocated": 0,
            "borrowed": 0,
            "transitioning": 0,
            "available_gpus": self.sim.sc.cluster.reserved_gpus + self.elastic_target * self.tp,
        }
        for s in self.slots.values():
            if s.state == SERVING and s.role is not None:
                row[str(s.role)] += 1
                if s.pool == "overlap":
                    row["borrowed"] += 1
            elif (s.state in (PENDING, DRAINING) and s.pool != "overlap") or (
                s.pool == "overlap" and s.state == PENDING
            ):
                row["transitioning"] += 1
        self.timeline.append(row)

    def close_borrows(self, end: float) -> None:
        for s in self.slots.values():
            if s.borrowed_since is not None:
                self.borrowed_gpu_s += (end - s.borrowed_since) * self.tp
                self.borrow_windows.append((s.borrowed_since, end, s.sid))
