"""The discrete-event cluster simulator: one policy on one scenario, in virtual time.

What is modelled (and why it is finer than the predictor's closed forms):
- every trajectory turn by turn (prompt, response, heavy-tailed environment latency), routed sticky
  to a worker whose prefix cache it reuses (colocated) or through prefill -> KV hand-off -> decode;
- every worker's continuous batching at iteration level (`engine.Worker`), with chunked prefill
  interfering with decode when colocated, serialised KV links and decode-pool KV limits when
  disaggregated;
- the asynchronous RL loop with max staleness 1: batch j may start once batch j−1 is collected and
  weights of version ≥ j−1 are published; the trainer consumes batches in order;
- elasticity: preemptible GPUs come and go by the trace (preparation in the background, then an
  admission-paused finalisation), training GPUs are borrowed as overlap workers between updates
  (activation) and returned at Training Begin (deactivation, before the trainer may start);
- preemption keeps partial trajectories (generated prefix + environment progress); the remainder
  resumes elsewhere after one re-prefill;
- transitions come from core `plan_transition` (minimal change); drained workers finish their
  running decodes before a role flip.
The policy under test is a core policy (`make_policy`), fed the simulator's telemetry records.
"""
from __future__ import annotations

import heapq
import math
import time as _time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from controlplane.core import telemetry as tm
from controlplane.core.policies import AvailabilityPoint, Overrides, PolicyAction, PolicyContext, Signal
from controlplane.core.state import Configuration, Mode, Role
from controlplane.sim.adapters import make_sim_policy, plan_roles
from controlplane.sim.engine import Request, ScaledCosts, Worker
from controlplane.sim.scenario import Scenario
from controlplane.sim.traces import AvailabilityTrace
from controlplane.sim.workload import Trajectory, draw_batch

# event kinds (ints keep heap tuples cheap)
EV_WAKE, EV_ARRIVE, EV_KV, EV_TRACE, EV_PREP, EV_READY, EV_TRAIN_DONE, EV_PERIODIC, EV_UNPAUSE, EV_RETURNED, EV_DRAIN_TIMEOUT = range(11)

# slot states
PREPARING, IDLE, PENDING, SERVING, DRAINING, INACTIVE, GONE = "preparing", "idle", "pending", "serving", "draining", "inactive", "gone"


@dataclass(slots=True)
class Slot:
    """A stable worker slot (G_w fixed for life) and its simulated engine."""

    sid: int
    pool: str  # reserved | elastic | overlap
    state: str
    worker: Worker
    role: Role | None = None
    ready_at: float = 0.0
    after_drain: tuple[str, Role | None] | None = None  # (next state, next role) once drained
    borrowed_since: float | None = None


@dataclass(slots=True)
class StepStats:
    step: int
    start_s: float
    end_s: float = 0.0
    generated_tokens: int = 0
    train_tokens: int = 0
    predicted_makespan_s: float | None = None
    predicted_at_start_s: float | None = None
    config_label: str = ""
    stable: bool = True  # no transition and no borrow change while the batch was in flight
    train_start_s: float = 0.0
    train_end_s: float = 0.0

    @property
    def makespan_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(slots=True)
class RunResult:
    scenario: str
    policy: str
    seed: int
    throughput_tok_s: float
    steps: int
    rollout_s_mean: float
    train_s_mean: float
    transitions: int
    borrowed_gpu_s: float
    return_deadline_misses: int
    lost_tokens: int
    predictor_mape: float | None
    wall_s: float = 0.0
    events: int = 0
    step_stats: list[StepStats] = field(default_factory=list)
    timeline: list[dict[str, Any]] = field(default_factory=list)  # role map changes for the report
    borrow_windows: list[tuple[float, float, int]] = field(default_factory=list)
    conservation: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {
            "throughput_tok_s": self.throughput_tok_s,
            "steps": self.steps,
            "rollout_s_mean": self.rollout_s_mean,
            "train_s_mean": self.train_s_mean,
            "transitions": self.transitions,
            "borrowed_gpu_s": self.borrowed_gpu_s,
            "return_deadline_misses": self.return_deadline_misses,
            "lost_tokens": self.lost_tokens,
            "predictor_mape": self.predictor_mape,
        }


class Simulation:
    """One run: `Simulation(scenario, "pearl").run()`."""

    def __init__(self, scenario: Scenario, policy: str, *, seed: int | None = None,
                 record_timeline: bool = False, trace: AvailabilityTrace | None = None) -> None:
        from controlplane.core.profiles import get_profile

        self.sc = scenario
        self.policy_name = policy
        self.seed = scenario.seed if seed is None else seed
        cl = scenario.cluster
        self.tp = cl.tp
        self.profile = get_profile(cl.hardware, scenario.model, cl.tp)
        self.reconf = self.profile.reconfig
        k = scenario.engine.engine_slowdown
        self.costs = ScaledCosts(self.profile, k)
        self.policy, variant = make_sim_policy(policy, scenario, self.profile)
        base = variant.base
        self.base_policy = base
        self.overrides = Overrides(**variant.overrides)
        self.free = base == "oracle"
        if trace is not None:
            self.trace = trace
        elif base == "fixed-large":
            self.trace = scenario.trace.constant(scenario.large_pool_gpus)
        else:
            self.trace = scenario.trace
        self.record_timeline = record_timeline
        self.prefix_reuse = scenario.workload.prefix_reuse
        self.kv_cap_tokens = int(self.profile.hbm_kv_capacity // self.profile.kv_bytes_per_token)
        self.kv_bytes = self.profile.kv_bytes_per_token
        self.bw = self.profile.bandwidth
        self.t = 0.0
        self.heap: list[tuple[float, int, int, Any, Any]] = []
        self._eseq = 0
        self.slots: dict[int, Slot] = {}
        self.serving: dict[Role, list[Slot]] = {Role.PREFILL: [], Role.DECODE: [], Role.COLOCATED: []}
        self.router_q: deque[Trajectory] = deque()
        self.paused_until = 0.0
        self.elastic_target = 0  # elastic GPUs the trace grants now
        # RL loop
        self.batch: list[Trajectory] = []
        self.remaining = 0
        self.rollout_step = -1  # batch being generated (or last generated)
        self.rollout_active = False
        self.version = 0  # completed + published training steps
        self.trained_next = 0  # next batch the trainer consumes
        self.ready_batches: dict[int, StepStats] = {}
        self.steps: list[StepStats] = []
        self.cur_step: StepStats | None = None
        self.train_done_times: list[float] = []
        # accounting
        self.transitions = 0
        self.deadline_misses = 0
        self.borrowed_gpu_s = 0.0
        self.borrow_windows: list[tuple[float, float, int]] = []
        self.traj_generated = 0
        self.done_trajs = 0
        self.started_trajs = 0
        self.timeline: list[dict[str, Any]] = []
        self.events = 0
        self.last_config: Configuration | None = None
        self.last_prediction: float | None = None
        self._env_by_traj: dict[str, float] = {}
        self._observe = self.policy.observe
        self._iter_sample = 0
        self._tb_time: dict[int, float] = {}
        self.training_active = False  # Training Begin .. Training Finished: no borrowing
        self.trainer_running = False

    # ================================================================== event plumbing
    def push(self, t: float, kind: int, a: Any = None, b: Any = None) -> None:
        self._eseq += 1
        heapq.heappush(self.heap, (t, self._eseq, kind, a, b))

    def run(self) -> RunResult:
        wall0 = _time.perf_counter()
        sc = self.sc
        end = sc.duration_s
        # t = 0: reserved workers exist; preemptible GPUs of the trace's first row are there too.
        n_res = sc.cluster.reserved_gpus // self.tp
        for _ in range(n_res):
            self._new_slot("reserved", IDLE)
        n_ovl = sc.cluster.training_gpus // self.tp
        for _ in range(n_ovl):
            self._new_slot("overlap", INACTIVE)
        self._set_elastic(0.0, self.trace.at(0.0), initial=True)
        for tt, g in self.trace.changes(end):
            self.push(tt, EV_TRACE, g)
        self._start_rollout(0.0)
        heap = self.heap
        pop = heapq.heappop
        while heap:
            t, _, kind, a, b = pop(heap)
            if t > end:
                break
            self.t = t
            self.events += 1
            if kind == EV_WAKE:
                slot = self.slots.get(a)
                if slot is None or slot.worker.version != b:
                    continue
                self._on_wake(slot, t)
            elif kind == EV_ARRIVE:
                self._on_arrive(a, t)
            elif kind == EV_KV:
                self._on_kv(a, b, t)
            elif kind == EV_TRACE:
                self._on_trace(a, t)
            elif kind == EV_PREP:
                self._on_prepared(a, b, t)
            elif kind == EV_READY:
                self._on_ready(a, b, t)
            elif kind == EV_TRAIN_DONE:
                self._on_train_done(a, t)
            elif kind == EV_PERIODIC:
                if self.rollout_active and a == self.rollout_step:
                    self._signal(Signal.PERIODIC, t)
                    self.push(t + sc.engine.periodic_s, EV_PERIODIC, a)
            elif kind == EV_UNPAUSE:
                if t >= self.paused_until - 1e-9:
                    self._flush_router(t)
            elif kind == EV_RETURNED:
                self._on_returned(a, b, t)
            elif kind == EV_DRAIN_TIMEOUT:
                slot = self.slots[a]
                if slot.state == DRAINING and slot.after_drain is not None and slot.worker.gen == b:
                    # drain_timeout: the rest is interrupted, partial trajectories resume elsewhere
                    self._evict(slot, t, keep_cache=False)
                    self._drained(slot, t)
        self.t = min(self.t, end)
        return self._result(_time.perf_counter() - wall0)

    # ================================================================== slots and capacity
    def _new_slot(self, pool: str, state: str) -> Slot:
        free = [s for s in self.slots.values() if s.state == GONE and s.pool == pool]
        if free:
            slot = free[0]
            slot.state = state
            slot.worker.gen += 1
            slot.worker.version += 1
            slot.role = None
            return slot
        sid = len(self.slots)
        w = Worker(sid, pool, Role.COLOCATED, self.costs, chunk_tokens=self.sc.engine.chunk_tokens,
                   kv_capacity=self.kv_cap_tokens)
        slot = Slot(sid, pool, state, w)
        self.slots[sid] = slot
        return slot

    def _dedicated(self, states: tuple[str, ...]) -> list[Slot]:
        return [s for s in self.slots.values() if s.pool != "overlap" and s.state in states]

    def _set_elastic(self, t: float, total_gpus: int, initial: bool = False) -> None:
        """Bring the number of elastic workers (incl. preparing) to what the trace grants."""
        reserved = self.sc.cluster.reserved_gpus
        want = max(0, total_gpus - reserved) // self.tp
        self.elastic_target = want
        live = [s for s in self.slots.values() if s.pool == "elastic" and s.state != GONE]
        if len(live) < want:
            for _ in range(want - len(live)):
                if initial or self.free:
                    self._new_slot("elastic", IDLE)
                else:
                    slot = self._new_slot("elastic", PREPARING)
                    slot.ready_at = t + self.reconf.inter_scale_preparation_s
                    self.push(slot.ready_at, EV_PREP, slot.sid, slot.worker.gen)
        elif len(live) > want:
            # Preemption: preparing workers go first, then idle ones, then the most recently joined.
            order = {PREPARING: 0, IDLE: 1, PENDING: 2, DRAINING: 3, SERVING: 4}
            victims = sorted(live, key=lambda s: (order.get(s.state, 5), -s.sid))[: len(live) - want]
            for s in victims:
                self._preempt(s, t)

    def _preempt(self, slot: Slot, t: float) -> None:
        was = slot.state
        self._leave_serving(slot)
        slot.state = GONE
        self._evict(slot, t, keep_cache=False)
        slot.role = None
        slot.after_drain = None
        slot.worker.gen += 1
        if was in (SERVING, PENDING, DRAINING):
            self._mark_unstable()
        self._log_timeline(t, "preempt")

    def _on_trace(self, gpus: int, t: float) -> None:
        before = self._capacity_key()
        self._set_elastic(t, gpus)
        if self._capacity_key() != before or self._forced_needed():
            self._signal(Signal.CAPACITY_CHANGE, t)
        self._flush_router(t)

    def _on_prepared(self, sid: int, gen: int, t: float) -> None:
        slot = self.slots[sid]
        if slot.state != PREPARING or slot.worker.gen != gen:
            return
        slot.state = IDLE
        self._signal(Signal.CAPACITY_CHANGE, t)

    def _capacity_key(self) -> tuple[int, int]:
        ready = len(self._dedicated((IDLE, PENDING, SERVING, DRAINING)))
        return ready, sum(1 for s in self.slots.values() if s.pool == "overlap" and s.state in (PENDING, SERVING))

    def _forced_needed(self) -> bool:
        p = self.serving[Role.PREFILL]
        d = self.serving[Role.DECODE]
        c = self.serving[Role.COLOCATED]
        return not c and (not p or not d)

    # ================================================================== policy
    def _current_config(self) -> Configuration | None:
        # The configuration being served once in-flight transitions complete (what the control
        # plane records as the job's current configuration): draining slots count in their next role.
        counts = {Role.PREFILL: 0, Role.DECODE: 0, Role.COLOCATED: 0}
        for s in self.slots.values():
            if s.state in (SERVING, PENDING) and s.role in counts:
                counts[s.role] += 1
            elif s.state == DRAINING and s.after_drain is not None and s.after_drain[0] == SERVING:
                counts[s.after_drain[1]] += 1
        if counts[Role.COLOCATED] and not counts[Role.PREFILL] and not counts[Role.DECODE]:
            return Configuration.colocated(counts[Role.COLOCATED])
        if counts[Role.PREFILL] and counts[Role.DECODE] and not counts[Role.COLOCATED]:
            return Configuration.disaggregated(counts[Role.PREFILL], counts[Role.DECODE])
        return None

    def _context(self, signal: Signal, t: float) -> PolicyContext:
        dedicated = len(self._dedicated((IDLE, PENDING, SERVING, DRAINING)))
        borrowed = sum(1 for s in self.slots.values() if s.pool == "overlap" and s.state in (PENDING, SERVING, DRAINING))
        n_ovl = sum(1 for s in self.slots.values() if s.pool == "overlap")
        future: tuple[AvailabilityPoint, ...] = ()
        if self.free:
            res = self.sc.cluster.reserved_gpus
            future = tuple(
                AvailabilityPoint(tt, (res + max(0, g - res) // self.tp * self.tp) // self.tp)
                for tt, g in self.trace.changes(self.sc.duration_s) if tt > t
            )
        return PolicyContext(
            now_s=t, signal=signal, dedicated_workers=dedicated,
            reserved_workers=self.sc.cluster.reserved_gpus // self.tp,
            overlap_workers=0 if self.training_active else n_ovl, training_active=self.training_active,
            current=self._current_config(), borrowed=borrowed, batch_size=self.sc.workload.batch_size,
            remaining=self.remaining if self.rollout_active else self.sc.workload.batch_size,
            overrides=self.overrides, future=future,
        )

    def _signal(self, signal: Signal, t: float) -> None:
        ctx = self._context(signal, t)
        action = self.policy.on_event(ctx)
        n_before = self.transitions
        self._apply(action, t, ctx)
        pred = getattr(action.decision, "predicted_makespan_s", None)
        st = self.cur_step
        if (st is not None and self.rollout_active and isinstance(pred, (int, float)) and math.isfinite(pred)
                and pred > 0 and (signal is Signal.STEP_START or self.transitions != n_before)):
            # Predicted batch completion from the latest configuration-changing decision: the time
            # already spent plus the remaining fraction R/B of the predicted makespan (the fluid
            # assumption of Eq. 7). At STEP_START this is the plain prediction.
            b = max(1, self.sc.workload.batch_size)
            st.predicted_makespan_s = (t - st.start_s) + ctx.remaining / b * float(pred)
            if signal is Signal.STEP_START:
                st.predicted_at_start_s = float(pred)

    # ================================================================== executor
    def _apply(self, action: PolicyAction, t: float, ctx: PolicyContext) -> None:
        free = self.free or bool(action.free_reconfiguration)
        target = action.target
        borrow = max(0, min(int(action.borrow), ctx.overlap_workers))
        if self.training_active:
            borrow = 0
        # choose the concrete slots: keep serving ones first (stable slots), reserved before elastic;
        # draining slots are busy until drained and returning overlap slots until returned
        def role_of(s: Slot) -> Role | None:
            """A slot's role once in-flight transitions complete (None: not in service)."""
            if s.state in (SERVING, PENDING):
                return s.role
            if s.state == DRAINING and s.after_drain is not None and s.after_drain[0] == SERVING:
                return s.after_drain[1]
            return None

        rank = {SERVING: 0, PENDING: 1, DRAINING: 1, IDLE: 2}
        ded = sorted((s for s in self.slots.values() if s.pool != "overlap"
                      and (s.state in (IDLE, PENDING, SERVING) or role_of(s) is not None)),
                     key=lambda s: (rank[s.state], s.pool != "reserved", s.sid))
        ovl = sorted((s for s in self.slots.values() if s.pool == "overlap"
                      and (s.state in (SERVING, PENDING, INACTIVE) or role_of(s) is not None)),
                     key=lambda s: ({SERVING: 0, PENDING: 1, DRAINING: 1, INACTIVE: 2}[s.state], s.sid))
        borrow = min(borrow, len(ovl))
        want_ded = max(0, min(target.total - borrow, len(ded)))
        want_total = want_ded + borrow
        if want_total <= 0:
            return
        target = _fit_config(target, want_total)
        if not any(s.state in (SERVING, PENDING, DRAINING) for s in self.slots.values()):
            free = True  # the initial configuration: the cluster starts configured
        chosen = ded[:want_ded] + ovl[:borrow]
        chosen_ids = {s.sid for s in chosen}
        in_service = [s for s in self.slots.values() if role_of(s) is not None]
        current_roles = {s.sid: role_of(s) for s in in_service}
        joining = [s.sid for s in chosen if s.sid not in current_roles]
        leaving = [s.sid for s in in_service if s.sid not in chosen_ids]
        inflight = {s.sid: s.worker.load() for s in in_service}
        plan = plan_roles(current_roles, target, joining=joining, leaving=leaving, inflight=inflight,
                          overlap=[s.sid for s in ovl])
        if not plan.add and not plan.remove and not plan.reassign:
            return
        self.transitions += 1
        self._mark_unstable()
        # 1) removals: overlap workers are returned, dedicated ones drained to idle
        for sid in plan.remove:
            slot = self.slots[sid]
            if slot.pool == "overlap":
                slot.after_drain = None
                self._return_overlap(slot, t, free)
            elif slot.state == DRAINING:
                slot.after_drain = (IDLE, None)  # already draining: it goes idle instead
            else:
                self._drain(slot, t, (IDLE, None), free)
        # 2) role changes of survivors: drain, then flip
        for sid, role in plan.reassign.items():
            slot = self.slots[sid]
            if slot.state == DRAINING:
                slot.after_drain = (SERVING, role)  # already draining: flip to the new role instead
            else:
                self._drain(slot, t, (SERVING, role), free)
        # 3) additions
        fin = 0.0 if free else self.reconf.inter_scale_finalisation_s
        any_inter = False
        for sid, role in plan.add.items():
            slot = self.slots[sid]
            slot.role = role
            slot.after_drain = None
            if slot.pool == "overlap":
                delay = 0.0 if free else self.reconf.intra_scale_activation_s
                if slot.borrowed_since is None:
                    slot.borrowed_since = t
            else:
                delay = fin
                any_inter = any_inter or fin > 0
            self._leave_serving(slot)
            slot.state = PENDING
            slot.worker.role = role
            slot.ready_at = t + delay
            slot.worker.version += 1
            self.push(t + delay, EV_READY, sid, slot.worker.version)
        if any_inter:
            # atomic finalisation: new-request admission pauses while the group is admitted
            self.paused_until = max(self.paused_until, t + fin)
            self.push(self.paused_until, EV_UNPAUSE)
        self.last_config = target
        self._log_timeline(t, "transition")

    def _drain(self, slot: Slot, t: float, then: tuple[str, Role | None], free: bool) -> None:
        """Stop admitting to `slot`; queued prompts are re-routed now, running decodes finish."""
        if slot.state == PENDING:
            # not serving yet: apply directly
            slot.worker.version += 1
            self._finish_transition(slot, then, t, free)
            return
        self._leave_serving(slot)
        slot.state = DRAINING
        slot.after_drain = then
        w = slot.worker
        queued = list(w.pq) + list(w.joinq)
        w.pq.clear()
        w.joinq.clear()
        for req in queued:
            self._requeue(req, 0, t)
        if free:
            for req, g in w.evict(t):
                self._requeue(req, g, t)
        if w.idle() and not w.running:
            self._drained(slot, t, free)
        else:
            self.push(t + self.sc.engine.drain_timeout_s, EV_DRAIN_TIMEOUT, slot.sid, w.gen)

    def _drained(self, slot: Slot, t: float, free: bool | None = None) -> None:
        then = slot.after_drain or (IDLE, None)
        slot.after_drain = None
        self._finish_transition(slot, then, t, self.free if free is None else free)

    def _finish_transition(self, slot: Slot, then: tuple[str, Role | None], t: float, free: bool) -> None:
        state, role = then
        w = slot.worker
        if state == SERVING and role is not None:
            if role != slot.role:
                w.gen += 1  # role flip re-partitions memory: the prefix cache is gone
            slot.role = role
            w.role = role
            slot.state = PENDING
            delay = 0.0 if free else self.reconf.role_change_s(0.0)
            w.version += 1
            self.push(t + delay, EV_READY, slot.sid, w.version)
        else:
            slot.state = IDLE
            slot.role = None
        self._log_timeline(t, "drained")

    def _on_ready(self, sid: int, version: int, t: float) -> None:
        slot = self.slots[sid]
        if slot.state != PENDING or slot.worker.version != version:
            return
        slot.state = SERVING
        slot.worker.serving = True
        self.serving[slot.role].append(slot)
        self._log_timeline(t, "ready")
        self._flush_router(t)

    def _leave_serving(self, slot: Slot) -> None:
        if slot.role is not None and slot in self.serving.get(slot.role, []):
            self.serving[slot.role].remove(slot)
        slot.worker.serving = False

    def _return_overlap(self, slot: Slot, t: float, free: bool) -> float:
        """Mandatory return of a borrowed training-GPU worker; partial trajectories are kept."""
        self._leave_serving(slot)
        slot.state = DRAINING
        slot.role = None
        self._evict(slot, t, keep_cache=False)
        slot.worker.version += 1
        delay = 0.0 if free else self.reconf.intra_scale_deactivation_s
        self.push(t + delay, EV_RETURNED, slot.sid, slot.worker.version)
        since = slot.borrowed_since if slot.borrowed_since is not None else t
        if self.sc.cluster.tp:
            self.borrowed_gpu_s += (t + delay - since) * self.tp
            self.borrow_windows.append((since, t + delay, slot.sid))
        slot.borrowed_since = None
        self._observe(tm.toggle(time_s=t, worker=slot.sid, activation_s=0.0 if free else self.reconf.intra_scale_activation_s,
                                return_s=delay, duration_s=(0.0 if free else self.reconf.toggle_s)))
        return t + delay

    def _on_returned(self, sid: int, version: int, t: float) -> None:
        slot = self.slots[sid]
        if slot.worker.version != version:
            return
        slot.state = INACTIVE
        self._log_timeline(t, "returned")
        self._maybe_start_training(t)

    def _mark_unstable(self) -> None:
        if self.cur_step is not None and self.rollout_active:
            self.cur_step.stable = False

    # ================================================================== routing and requests
    def _flush_router(self, t: float) -> None:
        if not self.router_q or t < self.paused_until - 1e-9:
            return
        q = self.router_q
        self.router_q = deque()
        for traj in q:
            self._route(traj, t)

    def _route(self, traj: Trajectory, t: float) -> None:
        if t < self.paused_until - 1e-9:
            self.router_q.append(traj)
            return
        col = self.serving[Role.COLOCATED]
        if col:
            pool = col
        elif self.serving[Role.PREFILL] and self.serving[Role.DECODE]:
            pool = self.serving[Role.PREFILL]
        else:
            self.router_q.append(traj)
            return
        slot = self._pick_home(traj, pool)
        w = slot.worker
        cached = traj.cached_len if (traj.cached_on == slot.sid and traj.cached_gen == w.gen) else 0
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
        self._kick(slot, t)

    def _pick_home(self, traj: Trajectory, pool: list[Slot]) -> Slot:
        """Sticky to the trajectory's home (prefix cache) unless it is clearly overloaded."""
        best = min(pool, key=lambda s: (s.worker.homed, s.sid))
        home = None
        if traj.home is not None:
            for s in pool:
                if s.sid == traj.home:
                    home = s
                    break
        if home is not None and home.worker.homed <= best.worker.homed + 2:
            return home
        self._unhome(traj)
        traj.home = best.sid
        best.worker.homed += 1
        best.worker.homed_ctx += traj.context
        return best

    def _unhome(self, traj: Trajectory) -> None:
        if traj.home is not None and traj.home in self.slots:
            old = self.slots[traj.home].worker
            old.homed = max(0, old.homed - 1)
            old.homed_ctx = max(0, old.homed_ctx - traj.context)
        traj.home = None

    def _grow(self, traj: Trajectory, tokens: int) -> None:
        traj.context += tokens
        if traj.home is not None:
            self.slots[traj.home].worker.homed_ctx += tokens

    def _kick(self, slot: Slot, t: float) -> None:
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

    def _on_wake(self, slot: Slot, t: float) -> None:
        w = slot.worker
        prefilled, done, seg = w.finish()
        n = len(w.running) + len(done)
        observe = self._observe
        if seg.kind == "decode" or (seg.kind == "prefill" and w.role is Role.COLOCATED and n):
            self._iter_sample += 1
            if seg.k >= 16 or self._iter_sample % 16 == 0:  # a sample is plenty for the A, b fit
                observe(tm.decode_iteration(time_s=t, worker=slot.sid, running_batch=n,
                                            duration_s=seg.dt if seg.kind == "decode" else (seg.end_s - seg.t0 - seg.prefill_s) / seg.k))
        if seg.kind == "prefill":
            observe(tm.prefill(time_s=t, worker=slot.sid, tokens=seg.prefill_tokens, duration_s=seg.prefill_s))
        for req in done:
            self._turn_done(req, t, slot)
        for req in prefilled:  # prefill role: hand the KV to a decode worker
            start = max(t, w.link_free_s)
            dur = req.ctx0 * self.kv_bytes / self.bw
            w.link_free_s = start + dur
            req.traj.cached_on = slot.sid
            req.traj.cached_gen = w.gen
            req.traj.cached_len = req.ctx0
            req.traj.where = -1
            self.push(start + dur, EV_KV, req, (slot.sid, w.gen))
            observe(tm.kv_transfer(time_s=start + dur, worker=slot.sid, tokens=req.ctx0,
                                   kv_bytes=int(req.ctx0 * self.kv_bytes), duration_s=dur))
        if w.seg is not None or slot.worker is not w or slot.state in (GONE, INACTIVE):
            return  # re-planned by a nested kick (e.g. the next batch started) or taken away meanwhile
        if slot.state == DRAINING and slot.after_drain is not None:
            if not w.running:
                # in-flight prefills of a draining prefill worker are done; decodes finished
                if not w.pq and not w.joinq:
                    self._drained(slot, t)
                    return
        end = w.plan(t)
        if end is not None:
            self.push(end, EV_WAKE, slot.sid, w.version)
        elif slot.state == DRAINING and slot.after_drain is not None:
            self._drained(slot, t)

    def _on_kv(self, req: Request, src: tuple[int, int], t: float) -> None:
        dec = self.serving[Role.DECODE]
        traj = req.traj
        sid, gen = src
        if not dec or self.slots[sid].worker.gen != gen:
            # no decode worker (mode changed) or the sender vanished mid-transfer: prefill again
            traj.where = None
            traj.interruptions += 1
            self._route(traj, t)
            return
        slot = min(dec, key=lambda s: (s.worker.load(), s.sid))
        req.arrive_s = t
        traj.where = slot.sid
        slot.worker.submit_decode(req)
        self._kick(slot, t)

    def _requeue(self, req: Request, generated: int, t: float) -> None:
        """An interrupted request: keep its generated prefix, resume the rest elsewhere."""
        traj = req.traj
        if generated:
            traj.generated_in_turn += generated
            traj.generated_total += generated
            self._grow(traj, generated)
            self.traj_generated += generated
            if self.cur_step is not None and traj.step == self.cur_step.step:
                self.cur_step.generated_tokens += generated
        traj.interruptions += 1
        traj.where = None
        if traj.generated_in_turn >= traj.turns[traj.turn].generated_tokens:
            self._complete_turn(traj, t)
        else:
            self._route(traj, t)

    def _evict(self, slot: Slot, t: float, keep_cache: bool) -> None:
        w = slot.worker
        for req, g in w.evict(t):
            self._requeue(req, g, t)
        if not keep_cache:
            w.gen += 1

    def _turn_done(self, req: Request, t: float, slot: Slot) -> None:
        traj = req.traj
        g = req.remaining
        traj.generated_in_turn += g
        traj.generated_total += g
        self._grow(traj, g)
        self.traj_generated += g
        if self.cur_step is not None and traj.step == self.cur_step.step:
            self.cur_step.generated_tokens += g
        if slot.role is Role.COLOCATED:
            traj.cached_on = slot.sid
            traj.cached_gen = slot.worker.gen
            traj.cached_len = traj.context
        traj.where = None
        self._complete_turn(traj, t)

    def _complete_turn(self, traj: Trajectory, t: float) -> None:
        spec = traj.turns[traj.turn]
        traj.gen_time_s += t - traj.turn_start_s
        self._observe(tm.turn(time_s=t, step=traj.step, trajectory=traj.tid, turn=traj.turn,
                              new_prompt_tokens=traj.prefilled_in_turn, generated_tokens=traj.generated_in_turn,
                              env_time_s=spec.env_latency_s))
        traj.turn += 1
        traj.generated_in_turn = 0
        traj.prefilled_in_turn = 0
        if traj.turn >= len(traj.turns):
            traj.done = True
            traj.end_s = t
            self._unhome(traj)
            self.done_trajs += 1
            self.remaining -= 1
            if self.remaining == 0:
                self._rollout_done(t)
            return
        traj.env_time_s += spec.env_latency_s
        self.push(t + spec.env_latency_s, EV_ARRIVE, traj)

    def _on_arrive(self, traj: Trajectory, t: float) -> None:
        self._begin_turn(traj, t)
        self._route(traj, t)

    def _begin_turn(self, traj: Trajectory, t: float) -> None:
        spec = traj.turns[traj.turn]
        self._grow(traj, spec.new_prompt_tokens)
        traj.prompt_total += spec.new_prompt_tokens
        traj.turn_start_s = t

    # ================================================================== RL loop
    def _start_rollout(self, t: float) -> None:
        j = self.rollout_step + 1
        self.rollout_step = j
        self.rollout_active = True
        self.batch = draw_batch(self.sc.workload, seed=self.seed, step=j)
        self.remaining = len(self.batch)
        self.started_trajs += len(self.batch)
        self.cur_step = StepStats(step=j, start_s=t)
        self._signal(Signal.STEP_START, t)
        self.cur_step.config_label = self.last_config.label() if self.last_config else ""
        self.cur_step.stable = True
        for traj in self.batch:
            traj.start_s = t
            self._begin_turn(traj, t)
            self._route(traj, t)
        if self.base_policy not in ("fixed", "fixed-large"):  # static pools have nothing to re-plan
            self.push(t + self.sc.engine.periodic_s, EV_PERIODIC, j)

    def _rollout_done(self, t: float) -> None:
        st = self.cur_step
        assert st is not None
        st.end_s = t
        st.train_tokens = sum(tr.total_tokens for tr in self.batch)
        self.rollout_active = False
        self.ready_batches[st.step] = st
        self.steps.append(st)
        self._emit_step(st, t)
        self._maybe_start_training(t)
        self._maybe_start_rollout(t)

    def _emit_step(self, st: StepStats, t: float) -> None:
        b = self.batch
        turns = [len(tr.turns) for tr in b]
        n_turns = sum(turns)
        last = max(b, key=lambda tr: tr.end_s)
        gen = sum(tr.gen_time_s for tr in b)
        env = sum(tr.env_time_s for tr in b)
        cfg = self._current_config() or self.last_config
        self._observe(tm.step(
            time_s=t, step=st.step, batch_size=len(b), turns_max=max(turns), turns_mean=n_turns / len(b),
            new_prompt_tokens_mean=sum(tr.prefilled_total for tr in b) / n_turns,
            generated_tokens_mean=sum(tr.generated_total for tr in b) / n_turns,
            env_time_total_s=last.env_time_s, active_decode_fraction=gen / (gen + env) if gen + env > 0 else 1.0,
            makespan_s=st.makespan_s, predicted_makespan_s=st.predicted_makespan_s or 0.0,
            mode=str(cfg.mode) if cfg else "", n_prefill=cfg.n_prefill if cfg else 0,
            n_decode=cfg.n_decode if cfg else 0, n_colocated=cfg.n_colocated if cfg else 0,
        ))

    def _maybe_start_rollout(self, t: float) -> None:
        j = self.rollout_step + 1
        if self.rollout_active or self.version < j - 1 or t >= self.sc.duration_s:
            return
        self._start_rollout(t)

    def _maybe_start_training(self, t: float) -> None:
        """Training Begin once batch j is collected and the trainer is free; borrowed GPUs go back
        first (mandatory), and the update starts only when every overlap worker has returned."""
        j = self.trained_next
        if self.trainer_running or j not in self.ready_batches:
            return
        if j not in self._tb_time:
            self._tb_time[j] = t
            self.training_active = True
            self._signal(Signal.TRAINING_BEGIN, t)
            for s in list(self.slots.values()):
                if s.pool == "overlap" and (s.state in (SERVING, PENDING)
                                            or (s.state == DRAINING and s.after_drain is not None)):
                    s.after_drain = None
                    self._return_overlap(s, t, self.free)
            self._flush_router(t)
        if any(s.pool == "overlap" and s.state != INACTIVE for s in self.slots.values()):
            return  # EV_RETURNED calls back here
        st = self.ready_batches.pop(j)
        self.trainer_running = True
        st.train_start_s = t
        if t - self._tb_time[j] > self.sc.engine.return_deadline_s:
            self.deadline_misses += 1
        dur = self.profile.train_step_s(st.train_tokens, self.sc.cluster.training_gpus) + self.sc.engine.weight_sync_s
        self.push(t + dur, EV_TRAIN_DONE, j)

    def _on_train_done(self, j: int, t: float) -> None:
        for st in self.steps:
            if st.step == j:
                st.train_end_s = t
        self.trainer_running = False
        self.version = j + 1
        self.trained_next = j + 1
        self.train_done_times.append(t)
        if self.trained_next in self.ready_batches:
            self._maybe_start_training(t)  # the next update starts at once: no borrow window
        else:
            self.training_active = False
            self._signal(Signal.TRAINING_FINISHED, t)
        self._maybe_start_rollout(t)

    # ================================================================== bookkeeping
    def _log_timeline(self, t: float, why: str) -> None:
        if not self.record_timeline:
            return
        row: dict[str, Any] = {"t": t, "why": why, "prefill": 0, "decode": 0, "colocated": 0, "borrowed": 0,
                               "transitioning": 0,
                               "available_gpus": self.sc.cluster.reserved_gpus + self.elastic_target * self.tp}
        for s in self.slots.values():
            if s.state == SERVING and s.role is not None:
                row[str(s.role)] += 1
                if s.pool == "overlap":
                    row["borrowed"] += 1
            elif s.state in (PENDING, DRAINING) and s.pool != "overlap" or (s.pool == "overlap" and s.state == PENDING):
                row["transitioning"] += 1
        self.timeline.append(row)

    def _result(self, wall: float) -> RunResult:
        end = min(self.t, self.sc.duration_s)
        for s in self.slots.values():
            if s.borrowed_since is not None:
                self.borrowed_gpu_s += (end - s.borrowed_since) * self.tp
                self.borrow_windows.append((s.borrowed_since, end, s.sid))
        trained = [s for s in self.steps if s.train_end_s > 0]
        warm = self.sc.engine.warmup_steps
        if len(trained) > warm + 1:
            body = trained[warm + 1:]
            span = body[-1].train_end_s - trained[warm].train_end_s
            tokens = sum(s.generated_tokens + s.train_tokens for s in body)
            thr = tokens / span if span > 0 else 0.0
        elif trained:
            tokens = sum(s.generated_tokens + s.train_tokens for s in trained)
            thr = tokens / trained[-1].train_end_s
        else:
            thr = 0.0
        ro = [s.makespan_s for s in self.steps]
        tr = [s.train_end_s - s.train_start_s - self.sc.engine.weight_sync_s for s in trained]
        errs = [abs(s.predicted_makespan_s - s.makespan_s) / s.makespan_s
                for s in self.steps[warm:] if s.predicted_makespan_s and s.makespan_s > 0]
        mape = 100.0 * sum(errs) / len(errs) if errs else None
        engine_tokens = sum(s.worker.tokens_out for s in self.slots.values())
        inflight_tokens = sum(s.worker.inflight_tokens() for s in self.slots.values())
        in_flight = sum(1 for tr_ in self.batch if not tr_.done) if self.rollout_active else 0
        return RunResult(
            scenario=self.sc.name, policy=self.policy_name, seed=self.seed, throughput_tok_s=round(thr, 3),
            steps=len(trained), rollout_s_mean=round(sum(ro) / len(ro), 3) if ro else 0.0,
            train_s_mean=round(sum(tr) / len(tr), 3) if tr else 0.0, transitions=self.transitions,
            borrowed_gpu_s=round(self.borrowed_gpu_s, 3), return_deadline_misses=self.deadline_misses,
            lost_tokens=int(engine_tokens - self.traj_generated - inflight_tokens),
            predictor_mape=None if mape is None else round(mape, 3), wall_s=wall, events=self.events,
            step_stats=list(self.steps), timeline=self.timeline, borrow_windows=self.borrow_windows,
            conservation={"started": self.started_trajs, "done": self.done_trajs, "in_flight": in_flight,
                          "engine_tokens": int(engine_tokens), "trajectory_tokens": int(self.traj_generated),
                          "inflight_tokens": int(inflight_tokens)},
        )



def _fit_config(target: Configuration, total: int) -> Configuration:
    """Scale a target onto `total` workers (the executor never exceeds what exists)."""
    if target.total == total:
        return target
    if target.mode is Mode.COLOCATED or total < 2:
        return Configuration.colocated(total)
    p = max(1, min(total - 1, round(target.n_prefill * total / max(1, target.total))))
    return Configuration.disaggregated(p, total - p)


def run_policy(scenario: Scenario, policy: str, *, seed: int | None = None, record_timeline: bool = False) -> RunResult:
    return Simulation(scenario, policy, seed=seed, record_timeline=record_timeline).run()
