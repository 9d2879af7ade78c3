"""The discrete-event cluster simulator: one policy on one scenario, in virtual time.

The simulator is a *driver* of the same core code the live system runs (docs/design.md §10): the RL loop
(`core.loop.RolloutLoop`: steps, routing, training handshake, staleness, telemetry), placement
(`core.placement.place`: budget → policy action → transition plan) and the policy under test
(`core.policies.make_policy`, fed the loop's and engines' telemetry). What is simulated is only
the world (`sim.world`: engines, KV links, environments, GPUs coming and going, transition
timings) and the trainer's duration (the profile's training-step cost). A figure from the
simulator therefore says what the live loop and planner would do on that world.
"""

from __future__ import annotations

import heapq
import math
import time as _time
from dataclasses import dataclass, field, replace
from typing import Any

from controlplane.core import loop as lp
from controlplane.core.batching import ScaledCosts
from controlplane.core.context import AvailabilityPoint, Overrides, Signal
from controlplane.core.placement import Placement, place
from controlplane.core.policies import StaticPool
from controlplane.core.telemetry import RecordKind
from controlplane.core.workload import draw_batch
from controlplane.sim import world as wd
from controlplane.sim.adapters import make_sim_policy
from controlplane.sim.scenario import Scenario
from controlplane.sim.traces import AvailabilityTrace

# heap events of the driver (the world's kinds are 0..7)
EV_TRACE, EV_TRAIN_DONE, EV_PUBLISHED, EV_TICK, EV_STOP, EV_SIGNAL = range(8, 14)


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
    mode: str = ""  # of the configuration the step started in
    # the step-start forecast of the best configuration of the *other* mode, same budget (its label)
    other_label: str = ""
    predicted_other_s: float | None = None
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
    # Step-start forecast at constant resources, per mode: |T̂(start) − T| / T over steps with no
    # transition or borrow change in flight, after warm-up (None: no such step in that mode)
    predictor_mape_start: dict[str, float | None] = field(default_factory=dict)
    stable_steps: dict[str, int] = field(default_factory=dict)
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
            "predictor_mape_start": self.predictor_mape_start,
        }


class SimCommands:
    """The simulator's command sink (`lp.CommandSink`): what the simulated world does with each command."""

    __slots__ = ("sim",)

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim

    def route_turn(self, cmd: lp.RouteTurn) -> None:
        self.sim.world.submit_first(cmd.trajectory, cmd.worker, self.sim.t)

    def resubmit(self, cmd: lp.Resubmit) -> None:
        self.sim.world.submit_first(cmd.trajectory, cmd.worker, self.sim.t)

    def route_decode(self, cmd: lp.RouteDecode) -> None:
        self.sim.world.submit_decode(cmd, self.sim.t)

    def telemetry(self, cmd: lp.Telemetry) -> None:
        sim, rec = self.sim, cmd.record
        if rec.kind is RecordKind.STEP:
            st = sim._by_step[rec.step]
            st.end_s = sim.t
            st.generated_tokens = rec.generated_tokens_total
            st.train_tokens = rec.train_tokens
            st.predicted_makespan_s = rec.predicted_makespan_s or None
            st.predicted_at_start_s = rec.predicted_at_start_s or None
        sim.observe(rec)

    def progress(self, cmd: lp.Progress) -> None:
        """The simulator reads R from the loop when it needs it."""

    def emit_signal(self, cmd: lp.EmitSignal) -> None:
        sim = self.sim
        if sim.fork_oracle:
            # handled from the event loop, after the loop's other commands of this event: a fork
            # taken then carries no half-dispatched command list
            sim.push(sim.t, EV_SIGNAL, cmd.signal, cmd.remaining)
        else:
            sim.signal(cmd.signal, cmd.remaining)

    def start_step(self, cmd: lp.StartStep) -> None:
        sim, t = self.sim, self.sim.t
        sim.world.start_batch(cmd, draw_batch(sim.sc.workload, seed=sim.seed, step=cmd.step), t)
        if sim.loop.cfg.periodic_s:
            sim.push(t + sim.loop.cfg.periodic_s, EV_TICK, cmd.step)

    def return_overlap(self, cmd: lp.ReturnOverlap) -> None:
        self.sim.world.return_all_overlap(self.sim.t)

    def train(self, cmd: lp.Train) -> None:
        sim, t = self.sim, self.sim.t
        st = sim._by_step[cmd.step]
        st.train_start_s = t
        train_s = sim.train_profile.train_step_s(st.train_tokens, sim.sc.cluster.training_gpus)
        sim.push(t + train_s, EV_TRAIN_DONE, cmd.step)

    def publish_weights(self, cmd: lp.PublishWeights) -> None:
        self.sim.push(self.sim.t + self.sim.sc.engine.weight_sync_s, EV_PUBLISHED, cmd.version)

    def abort(self, cmd: lp.Abort) -> None:
        self.sim.world.abort(cmd, self.sim.t)


class Simulation:
    """One run: `Simulation(scenario, names.PEARL).run()` (a policy or a scenario variant's name)."""

    def __init__(
        self,
        scenario: Scenario,
        policy: str,
        *,
        seed: int | None = None,
        record_timeline: bool = False,
        trace: AvailabilityTrace | None = None,
    ) -> None:
        from controlplane.core.profiles import dispatch_cap, get_profile

        self.sc = scenario
        self.policy_name = policy
        self.seed = scenario.seed if seed is None else seed
        cl = scenario.cluster
        self.tp = cl.tp
        self.profile = get_profile(cl.hardware, scenario.model, cl.tp)
        self.costs = ScaledCosts(self.profile, scenario.engine.engine_slowdown)
        # the training GPUs' chip: trainer step time, and the engines of overlap workers borrowed from it
        self.train_profile = self.profile
        self.overlap_costs = self.costs
        if cl.training_hardware and get_profile(cl.training_hardware, scenario.model, cl.tp) != self.profile:
            self.train_profile = get_profile(cl.training_hardware, scenario.model, cl.tp)
            self.overlap_costs = ScaledCosts(self.train_profile, scenario.engine.engine_slowdown)
        # per chip type (mixed pools, issue 23): each unit's engine is timed by its own chip's profile
        self._profiles: dict[str, Any] = {self.profile.hardware.upper(): self.profile}
        self._costs: dict[str, ScaledCosts] = {self.profile.hardware.upper(): self.costs}
        if self.train_profile is not self.profile:
            self._profiles[self.train_profile.hardware.upper()] = self.train_profile
            self._costs[self.train_profile.hardware.upper()] = self.overlap_costs
        # what-if only (never set in a shipped scenario): every KV hand-off takes this many times its time
        kv = scenario.engine.kv_transfer_scale
        self.kv_link_scale = math.inf if kv == 0 else 1.0 / kv
        self.policy, variant = make_sim_policy(policy, scenario, self.profile)
        pol = self.policy
        self.base_policy = variant.base
        self.overrides = Overrides(**variant.overrides)
        self.free = pol.free_reconfiguration
        # A policy chosen by simulated outcome (the oracle, sim/oracle.py): at each signal this simulation
        # forks, tries every candidate configuration × borrow choice on the real future, and keeps the one
        # whose step finishes first. Inside a fork the candidate's overrides stay in force.
        self.fork_oracle = pol.chooses_by_simulation
        self.in_fork = False
        self.oracle_forks = 0
        self.oracle_overrides: Overrides | None = None  # the oracle's last choice, in force until the next
        if trace is not None:
            self.trace = trace
        elif pol.static_pool is StaticPool.TRACE_MEAN:  # ROLL-Large: its pool of the trace's mean is always there
            self.trace = scenario.trace.constant(scenario.large_pool_gpus)
        else:
            self.trace = scenario.trace
        self.record_timeline = record_timeline
        static = pol.static_pool is not None  # static pools have nothing to re-plan
        wl = scenario.workload
        # RLBoost's Algorithm 2: JSQ with delayed dispatch at the plateau batch (sticky: no cap)
        dispatch, cap = pol.dispatch, dispatch_cap(pol.dispatch, self.profile, wl.max_length)
        self.loop = lp.RolloutLoop(
            lp.LoopConfig(
                batch_size=wl.batch_size,
                group_size=wl.group_size,
                max_staleness=scenario.max_staleness,
                return_deadline_s=scenario.engine.return_deadline_s,
                periodic_s=None if static else scenario.engine.periodic_s,
                job=scenario.name,
                dispatch=dispatch,
                dispatch_cap=cap,
            )
        )
        self.t = 0.0
        self.heap: list[tuple[float, int, int, Any, Any]] = []
        self._eseq = 0
        self.events = 0
        self.feed = lp.Feeder(self.loop, lp.Dispatcher(SimCommands(self))).feed
        self.observe = self.policy.observe
        self.world = wd.World(self)
        self.steps: list[StepStats] = []
        self._by_step: dict[int, StepStats] = {}
        self.training_active = False

    # ================================================================== plumbing
    def profile_for(self, hardware: str) -> Any:
        """The profile of one chip type (a TP group of `tp` GPUs of the scenario's model)."""
        from controlplane.core.profiles import get_profile

        key = hardware.upper()
        if key not in self._profiles:
            self._profiles[key] = get_profile(key, self.sc.model, self.tp)
        return self._profiles[key]

    def costs_for(self, hardware: str) -> ScaledCosts:
        key = hardware.upper()
        if key not in self._costs:
            self._costs[key] = ScaledCosts(self.profile_for(key), self.sc.engine.engine_slowdown)
        return self._costs[key]

    @property
    def slots(self) -> dict[int, wd.Slot]:
        return self.world.slots

    @property
    def batch(self) -> list[Any]:
        return self.world.batch

    def push(self, t: float, kind: int, a: Any = None, b: Any = None) -> None:
        self._eseq += 1
        heapq.heappush(self.heap, (t, self._eseq, kind, a, b))

    def unstable(self) -> None:
        """Resources changed while a batch was in flight (the step is not a constant-resource one)."""
        if self.steps and self.loop.rollout_active:
            self.steps[-1].stable = False

    # ================================================================== the elastic scheduler
    def signal(self, signal: Signal, remaining: int) -> Placement:
        """The Elastic Scheduler on one signal: placement over the world's inventory, executed in it."""
        t = self.t
        if signal is Signal.STEP_START:
            st = StepStats(self.loop.step, t)
            self.steps.append(st)
            self._by_step[st.step] = st
        elif signal is Signal.TRAINING_BEGIN:
            self.training_active = True
            returned = self.world.return_borrowed(t)
        elif signal is Signal.TRAINING_FINISHED:
            self.training_active = False
        ov = self.overrides
        if self.fork_oracle and not self.in_fork:
            from controlplane.sim.oracle import choose

            picked = choose(self, signal, remaining)
            if picked is not None:
                self.oracle_overrides = picked
            ov = self.oracle_overrides or ov
        inv = self.world.inventory(self.training_active)
        if signal is Signal.TRAINING_BEGIN:
            inv = replace(inv, returned=returned)
        p = place(
            inv,
            self.policy,
            signal=signal,
            now_s=t,
            batch_size=self.sc.workload.batch_size,
            remaining=remaining,
            overrides=ov,
            future=self._future(t),
        )
        changed = self.world.execute(p, t, self.free or p.action.free_reconfiguration) if p.target.total > 0 else False
        if changed and signal is not Signal.STEP_START:  # the step's own starting transition is not a change
            self.unstable()
        if signal is Signal.STEP_START:
            st = self.steps[-1]
            cfg = p.target if p.target.total > 0 else p.current or p.target
            st.config_label = cfg.label()
            st.mode = str(cfg.mode)
            other = _best_other(p.action.decision.candidates, cfg)
            if other is not None:
                st.other_label, st.predicted_other_s = other
        pred = p.action.decision.predicted_makespan_s
        self.feed(
            lp.Decided(
                t, signal, p.target if p.target.total > 0 else None, pred if math.isfinite(pred) else None, changed
            )
        )
        return p

    def _future(self, t: float) -> tuple[AvailabilityPoint, ...]:
        if not self.free:
            return ()
        res, tp = self.sc.cluster.reserved_gpus, self.tp
        return tuple(
            AvailabilityPoint(tt, (res + max(0, g - res) // tp * tp) // tp)
            for tt, g in self.trace.changes(self.sc.duration_s)
            if tt > t
        )

    # ================================================================== run
    def run(self) -> RunResult:
        wall0 = _time.perf_counter()
        self.setup()
        self.feed(lp.Start(0.0))
        self.advance(self.sc.duration_s)
        return self._result(_time.perf_counter() - wall0)

    def setup(self) -> None:
        """t = 0: training units (each with its inactive overlap worker), the reserved units, the
        preemptible units of the trace's first row; the trace's changes and the end are scheduled."""
        sc, w = self.sc, self.world
        w.add_training_units(sc.cluster.training_gpus // self.tp)
        for _ in range(sc.cluster.reserved_gpus // self.tp):
            w.new_unit("reserved", wd.IDLE)
        w.set_elastic(0.0, self.trace.at(0.0), initial=True)
        for tt, g in self.trace.changes(sc.duration_s):
            self.push(tt, EV_TRACE, g)
        self.push(sc.duration_s, EV_STOP)

    def advance(self, end: float) -> None:
        """Process every event up to virtual time `end`."""
        sc, w = self.sc, self.world
        heap = self.heap
        pop = heapq.heappop
        while heap and heap[0][0] <= end:
            t, _, kind, a, b = pop(heap)
            self.t = t
            self.events += 1
            if kind == wd.EV_WAKE:
                w.on_wake(a, b, t)
            elif kind == wd.EV_ENV:
                w.on_env(a, t)
            elif kind == wd.EV_KV:
                w.on_kv(a, b, t)
            elif kind == EV_TRACE:
                before = w.capacity_key()
                w.set_elastic(t, a)
                if w.capacity_key() != before or self.loop.router.mode is None:
                    self.signal(Signal.CAPACITY_CHANGE, self.loop.remaining)
            elif kind == wd.EV_PREP:
                if w.on_prepared(a, b):
                    self.signal(Signal.CAPACITY_CHANGE, self.loop.remaining)
            elif kind == wd.EV_READY:
                w.on_ready(a, b, t)
            elif kind == EV_TRAIN_DONE:
                self.feed(lp.TrainingDone(t, a))
            elif kind == EV_PUBLISHED:
                st = self._by_step.get(a - 1)
                if st is not None:
                    st.train_end_s = t
                w.on_weights_published(t)
                self.feed(lp.WeightsPublished(t, a))
            elif kind == EV_TICK:
                if self.loop.rollout_active and self.loop.step == a:
                    self.feed(lp.Tick(t))
                    self.push(t + sc.engine.periodic_s, EV_TICK, a)
            elif kind == wd.EV_UNPAUSE:
                w.on_unpause(t)
            elif kind == wd.EV_RETURNED:
                w.on_returned(a, b, t)
            elif kind == wd.EV_DRAIN_TIMEOUT:
                w.on_drain_timeout(a, b, t)
            elif kind == EV_STOP:
                self.feed(lp.Stop(t))
            elif kind == EV_SIGNAL:
                self.signal(a, b)
        self.t = max(self.t, min(end, sc.duration_s))

    def _result(self, wall: float) -> RunResult:
        end = min(self.t, self.sc.duration_s)
        w = self.world
        w.close_borrows(end)
        trained = [s for s in self.steps if s.train_end_s > 0]
        warm = self.sc.engine.warmup_steps
        thr = window_throughput(trained, warm)
        done = [s for s in self.steps if s.end_s > 0]
        ro = [s.makespan_s for s in done]
        tr = [s.train_end_s - s.train_start_s - self.sc.engine.weight_sync_s for s in trained]
        errs = [
            abs(s.predicted_makespan_s - s.makespan_s) / s.makespan_s
            for s in done[warm:]
            if s.predicted_makespan_s and s.makespan_s > 0
        ]
        mape = 100.0 * sum(errs) / len(errs) if errs else None
        start_mape, stable_n = step_start_mape(done[warm:])
        engine_tokens = sum(s.worker.tokens_out for s in w.slots.values())
        inflight_tokens = sum(s.worker.inflight_tokens() for s in w.slots.values())
        loop = self.loop
        in_flight = loop.started_trajectories - loop.finished_trajectories - loop.stale_aborted
        return RunResult(
            scenario=self.sc.name,
            policy=self.policy_name,
            seed=self.seed,
            throughput_tok_s=round(thr, 3),
            steps=len(trained),
            rollout_s_mean=round(sum(ro) / len(ro), 3) if ro else 0.0,
            train_s_mean=round(sum(tr) / len(tr), 3) if tr else 0.0,
            transitions=w.transitions,
            borrowed_gpu_s=round(w.borrowed_gpu_s, 3),
            return_deadline_misses=loop.deadline_misses,
            lost_tokens=int(engine_tokens - w.traj_generated - inflight_tokens),
            predictor_mape=None if mape is None else round(mape, 3),
            predictor_mape_start=start_mape,
            stable_steps=stable_n,
            wall_s=wall,
            events=self.events,
            step_stats=done,
            timeline=w.timeline,
            borrow_windows=w.borrow_windows,
            conservation={
                "started": loop.started_trajectories,
                "done": loop.finished_trajectories,
                "in_flight": in_flight,
                "aborted": loop.stale_aborted,
                "engine_tokens": int(engine_tokens),
                "trajectory_tokens": int(w.traj_generated),
                "inflight_tokens": int(inflight_tokens),
            },
        )


def window_throughput(trained: list[StepStats], warm: int, last: int | None = None) -> float:
    """(Generated + trained tokens) / time over the trained steps after warm-up, up to step index
    `last` (default: the last trained): from the end of warm-up training to the end of the last one."""
    k = len(trained) - 1 if last is None else last
    if k > warm:
        body = trained[warm + 1 : k + 1]
        span = trained[k].train_end_s - trained[warm].train_end_s
        return sum(s.generated_tokens + s.train_tokens for s in body) / span if span > 0 else 0.0
    if trained:
        return sum(s.generated_tokens + s.train_tokens for s in trained[: k + 1]) / trained[k].train_end_s
    return 0.0


def _best_other(table: Any, cfg: Any) -> tuple[str, float] | None:
    """The best feasible candidate of the mode `cfg` is not in, from a decision's candidate table."""
    from controlplane.core.state import Mode

    if table is None or cfg.total <= 0:
        return None
    if cfg.mode is Mode.COLOCATED:
        c = table.best_disaggregated()
    else:
        c = table.colocated if table.colocated is not None and table.colocated.feasible else None
    if c is None or not math.isfinite(c.makespan_s):
        return None
    return c.label, c.makespan_s


def step_start_mape(steps: list[StepStats]) -> tuple[dict[str, float | None], dict[str, int]]:
    """Per mode: MAPE of the step-start forecast of the configuration that ran, over constant-resource
    steps only (no transition or borrow change while the batch was in flight)."""
    out: dict[str, float | None] = {}
    counts: dict[str, int] = {}
    for mode in ("colocated", "disaggregated"):
        errs = [
            abs(s.predicted_at_start_s - s.makespan_s) / s.makespan_s
            for s in steps
            if s.stable and s.mode == mode and s.predicted_at_start_s and s.makespan_s > 0
        ]
        counts[mode] = len(errs)
        out[mode] = round(100.0 * sum(errs) / len(errs), 3) if errs else None
    return out, counts


def run_policy(scenario: Scenario, policy: str, *, seed: int | None = None, record_timeline: bool = False) -> RunResult:
    return Simulation(scenario, policy, seed=seed, record_timeline=record_timeline).run()
