"""Several jobs on one simulated cluster (issue 35): each job is a `cluster.Simulation` of its own (its RL loop,
its PEARL policy and placement, its world of units), all on one virtual clock; the cluster's dedicated rollout
units (reserved + the trace's preemptible GPUs) are divided among the running jobs by a sharing policy:

- `pearl`: the arbiter (`core.arbiter.arbitrate`, the code the live planner is to run) with cross-job
  borrowing of idle training units;
- `static`: a fixed equal split (`core.arbiter.split_static`); `fcfs`: first come keeps (`split_fcfs`);
  `rlix`: split by outstanding demand (`split_rlix`).

The division is re-run on every job arrival, trace change and training phase change (step start, Training
Begin, Training Finished). A job's allotment reaches its world as its elastic units: a unit that joins
prepares (loads the job's weights) before it serves, a unit that leaves is preempted at once (its partial
trajectories continue on the job's other workers). A lent training unit is marked lent in its owner's world
(the owner cannot borrow it meanwhile) and is an elastic unit of the borrower's until the owner's Training
Begin takes it back.
"""

from __future__ import annotations

import heapq
import math
import time as _time
from dataclasses import dataclass, field, replace
from typing import Any

from controlplane.core import loop as lp
from controlplane.core.arbiter import Allotment, JobDemand, arbitrate, division_unit
from controlplane.core.context import Signal
from controlplane.core.policies import names
from controlplane.core.policies.base import best_makespan, best_step_time
from controlplane.core.profiles import get_reconfig_costs
from controlplane.core.sharing import SHARING_NAMES, Sharing, split_fcfs, split_rlix, split_static
from controlplane.sim import units as un
from controlplane.sim.cluster import EV_STOP, RunResult, Simulation
from controlplane.sim.scenario import ClusterSpec, JobSpec, Scenario
from controlplane.sim.traces import AvailabilityTrace

_G_ARRIVE, _G_TRACE, _G_STOP = 0, 1, 2
MAX_EXPLANATIONS = 200  # reallocation explanations kept per run


@dataclass(slots=True)
class JobRun:
    """One job of the run: its own simulation, placed on the global clock at `spec.arrival_s`."""

    spec: JobSpec
    index: int
    sim: Simulation
    started: bool = False
    ended: bool = False  # its `steps` trainer updates are done: its units went back to the pool
    phase: tuple[bool, int] = (False, -1)
    units: int = 0  # rollout workers its world has now (dedicated + borrowed)
    lent: int = 0  # its training units lent out now (one worker each)
    curve: dict[int, float] = field(default_factory=dict)
    curve_key: tuple[Any, float] | None = None  # (the fit, the trainer's update time) `curve` was computed on
    result: RunResult | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def tp(self) -> int:
        return self.sim.sc.cluster.tp

    def local(self, t: float) -> float:
        return t - self.spec.arrival_s


@dataclass(slots=True)
class JobResult:
    name: str
    throughput_tok_s: float
    steps: int
    step_time_s: float | None
    trained_tokens: int
    misses: int
    lost_tokens: int
    # trained tokens at the job's own measured rate (trained tokens / time from arrival to its last update)
    # over its whole window up to the end: the step in flight at the end counts pro rata, not as nothing
    prorated_tokens: float = 0.0

    def summary(self, static: JobResult | None) -> dict[str, Any]:
        slow = None
        if static is not None and static.step_time_s and self.step_time_s:
            slow = round(static.step_time_s / self.step_time_s, 4)
        return {
            "throughput": self.throughput_tok_s,
            "steps": self.steps,
            "step_time_s": self.step_time_s,
            "slowdown": slow,
            "misses": self.misses,
            "lost_tokens": self.lost_tokens,
            "vs_static": round(self.throughput_tok_s / static.throughput_tok_s, 4)
            if static is not None and static.throughput_tok_s > 0
            else None,
        }


@dataclass(slots=True)
class MultiResult:
    scenario: str
    policy: str
    seed: int
    jobs: dict[str, JobResult]
    trained_tokens: int
    gpu_hours: float
    reallocations: int
    lent_gpu_s: float
    explanations: list[str]
    wall_s: float = 0.0

    @property
    def cost_efficiency(self) -> float:
        """Trained tokens per GPU-hour of the whole cluster (training + reserved + the trace's preemptible)."""
        return self.trained_tokens / self.gpu_hours if self.gpu_hours > 0 else 0.0

    @property
    def cost_efficiency_prorated(self) -> float:
        """The same with each job's unfinished last step counted pro rata (`JobResult.prorated_tokens`).

        Whole steps only, a job of ~15 steps moves in 6% jumps: two policies whose step times differ by 3%
        often train the very same tokens (the batches are paired), so `cost_efficiency` cannot see the gap."""
        tokens = sum(j.prorated_tokens for j in self.jobs.values())
        return tokens / self.gpu_hours if self.gpu_hours > 0 else 0.0

    def summary(self, static: MultiResult | None) -> dict[str, Any]:
        jain = None
        if static is not None:
            xs = [
                r.throughput_tok_s / static.jobs[n].throughput_tok_s
                for n, r in self.jobs.items()
                if static.jobs[n].throughput_tok_s > 0
            ]
            jain = round(sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs)), 4) if xs and any(xs) else 0.0
        return {
            "cost_efficiency": round(self.cost_efficiency, 3),
            "cost_efficiency_prorated": round(self.cost_efficiency_prorated, 3),
            "jain": jain,
            "trained_tokens": self.trained_tokens,
            "gpu_hours": round(self.gpu_hours, 3),
            "misses": sum(r.misses for r in self.jobs.values()),
            "reallocations": self.reallocations,
            "lent_gpu_s": round(self.lent_gpu_s, 1),
            "jobs": {n: r.summary(static.jobs.get(n) if static else None) for n, r in self.jobs.items()},
            "explanations": self.explanations[:20],
        }


def job_scenario(sc: Scenario, spec: JobSpec, index: int) -> Scenario:
    """The one-job scenario a job's simulation runs: its model, trainer and workload on the shared cluster's
    hardware, at its TP; its rollout units come from the sharing policy (the trace here is a placeholder)."""
    cl = sc.cluster
    tp = job_tp(sc, spec)
    return Scenario(
        name=spec.name,
        model=spec.model,
        cluster=ClusterSpec(
            training_gpus=spec.training_gpus,
            reserved_gpus=tp,
            preemptible_gpus=0,
            hardware=cl.hardware,
            tp=tp,
            training_hardware=cl.training_hardware,
        ),
        workload=spec.workload,
        engine=sc.engine,
        trace=AvailabilityTrace((0.0,), (tp,), name="allotment"),
        duration_s=max(0.0, sc.duration_s - spec.arrival_s),
        seed=sc.seed + 1009 * index,
        policies=(names.PEARL,),
        max_staleness=spec.max_staleness,
    )


def job_tp(sc: Scenario, spec: JobSpec) -> int:
    """The TP of the job's workers: its own, or the cluster's."""
    return spec.tp or sc.cluster.tp


class MultiSimulation:
    """`MultiSimulation(scenario, "pearl").run()`: every job of a `jobs:` scenario under one sharing policy."""

    def __init__(self, scenario: Scenario, policy: str, *, seed: int | None = None) -> None:
        if not scenario.jobs:
            raise ValueError(f"scenario {scenario.name} has no jobs: list")
        self.sc = replace(scenario, seed=scenario.seed if seed is None else seed)
        self.sharing = Sharing(policy)
        # GPUs of one arbiter unit (as live: the jobs' common TP, else their greatest common divisor)
        self.unit = division_unit(job_tp(scenario, s) for s in scenario.jobs)
        self.runs = [
            JobRun(s, i, Simulation(job_scenario(self.sc, s, i), names.PEARL)) for i, s in enumerate(scenario.jobs)
        ]
        self.by_name = {r.name: r for r in self.runs}
        self.t = 0.0
        self.heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        self.capacity = self._units_of(scenario.trace.at(0.0))
        self.allot = Allotment({})
        self.reallocations = 0
        self.explanations: list[str] = []
        self.lent_gpu_s = 0.0
        self._lent_since = 0.0

    def _units_of(self, gpus: int) -> int:
        res = self.sc.cluster.reserved_gpus
        return res // self.unit + max(0, gpus - res) // self.unit

    def _push(self, t: float, kind: int, a: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (t, self._seq, kind, a))

    # ------------------------------------------------------------------ the division
    def _curve(self, run: JobRun) -> Any:
        """The job's predicted step time with n rollout units (`best_step_time`: its rollout makespan against its
        trainer's last update), from its own policy's fitted predictor as it stands now.

        Memoised per fit and update time: the tracker refits on every record and the update time is known
        only once a step has trained, so a memo kept per step mixed two curves (T(3) from the prior before the
        first update, T(4) from after it: T(4) > T(3), a unit worth less than nothing, and a late job below
        its fair share was passed over when capacity came back)."""
        sim, per_worker = run.sim, run.tp // self.unit
        fp = sim.policy.tracker.fitted()
        trained = [s for s in sim.steps if s.train_end_s > 0]
        train_s = trained[-1].train_end_s - trained[-1].train_start_s if trained else 0.0
        if run.curve_key is None or run.curve_key[0] is not fp or run.curve_key[1] != train_s:
            run.curve_key = (fp, train_s)
            run.curve = {}
        memo = run.curve

        def at(n: int) -> float:
            v = memo.get(n)
            if v is None:
                workers = n // per_worker
                v = best_step_time(
                    fp.workload,
                    fp.coefficients,
                    workers,
                    train_s,
                    max_staleness=sim.loop.cfg.max_staleness,
                    error=fp.makespan_error,
                )
                memo[n] = v
            return v

        return at

    def _demand(self, run: JobRun, now: float) -> JobDemand:
        sim, spec, unit = run.sim, run.spec, self.unit
        per_worker = run.tp // unit
        costs = get_reconfig_costs(spec.model)
        loop = sim.loop
        lendable = 0
        tb = math.inf
        if run.started and not sim.training_active:
            lendable = per_worker * sum(
                1
                for s in sim.world.slots.values()
                if s.pool == "overlap" and (s.lent or (s.state == un.INACTIVE and s.borrowed_since is None))
            )
            if loop.rollout_active and sim.sc.workload.batch_size > 0:
                frac = loop.remaining / sim.sc.workload.batch_size
                tb = now + frac * best_makespan(
                    sim.policy.tracker.fitted().workload, sim.policy.tracker.fitted().coefficients, max(1, run.units)
                )
        return JobDemand(
            name=spec.name,
            max_units=spec.rollout_gpus // unit,
            step_time=self._curve(run),
            priority=spec.priority,
            weight=spec.weight,
            min_units=spec.min_rollout_gpus // unit,
            arrival_s=spec.arrival_s,
            training=sim.training_active,
            lendable_units=lendable,  # no `lendable_groups`: a simulated job's training units are not on nodes
            training_begin_s=tb,
            reload_s=costs.inter_scale_preparation_s,
            kv_loss_s=costs.inter_scale_finalisation_s,
            deactivation_s=costs.intra_scale_deactivation_s,
            outstanding=loop.remaining * run.tp,
            worker_units=per_worker,
            measured=sim.policy.tracker.fitted().measured,
        )

    def divide(self, reason: str) -> None:
        """Re-run the sharing policy over the running jobs and apply the result to their worlds."""
        t = self.t
        running = [r for r in self.runs if r.started and not r.ended]
        demands = [self._demand(r, t) for r in running]
        prev = self.allot
        if self.sharing is Sharing.PEARL:
            new = arbitrate(self.capacity, demands, prev, reason=reason, now_s=t)
        else:
            if self.sharing is Sharing.STATIC:
                units = split_static(self.capacity, [r.name for r in self.runs], demands)
            elif self.sharing is Sharing.FCFS:
                units = split_fcfs(self.capacity, demands, prev.units)
            else:
                units = split_rlix(self.capacity, demands, prev.units)
            new = Allotment(units)
        if new.units != prev.units or new.lends != prev.lends:
            self.reallocations += 1
            if new.explanation and len(self.explanations) < MAX_EXPLANATIONS:
                self.explanations.extend(f"t={t:.0f}s {e}" for e in new.explanation)
        lent_now = sum(x.units for x in prev.lends)
        self.lent_gpu_s += lent_now * self.unit * (t - self._lent_since)
        self._lent_since = t
        self.allot = new

        # shrink first (units leave before others join), then grow
        def workers(r: JobRun, units: int) -> int:
            return units * self.unit // r.tp

        order = sorted(running, key=lambda r: workers(r, new.total(r.name)) - r.units)
        for r in order:
            self._apply(r, workers(r, new.total(r.name)), workers(r, new.lent(r.name)))

    def _apply(self, run: JobRun, units: int, lent: int) -> None:
        """Its world gets `units` rollout workers (dedicated and borrowed) and lends `lent` training units."""
        sim, w = run.sim, run.sim.world
        if sim.loop.stopped:
            return
        tl = run.local(self.t)
        sim.t = tl
        changed = False
        if lent != run.lent:
            ovl = sorted((s for s in w.slots.values() if s.pool == "overlap"), key=lambda s: s.sid)
            marked = [s for s in ovl if s.lent]
            if lent < len(marked):
                for s in marked[lent:]:
                    s.lent = False
            else:
                free = [s for s in ovl if not s.lent and s.state == un.INACTIVE and s.borrowed_since is None]
                for s in free[: lent - len(marked)]:
                    s.lent = True
            run.lent = sum(1 for s in ovl if s.lent)
            changed = True
        if units != run.units:
            before = w.capacity_key()
            w.set_elastic_units(tl, units)
            run.units = units
            changed = changed or w.capacity_key() != before
        if changed or sim.loop.router.mode is None:
            sim.signal(Signal.CAPACITY_CHANGE, sim.loop.remaining)

    # ------------------------------------------------------------------ run
    def _start(self, run: JobRun) -> None:
        sim, w = run.sim, run.sim.world
        run.started = True
        w.add_training_units(run.spec.training_gpus // run.tp)
        sim.push(sim.sc.duration_s, EV_STOP)
        self.divide(f"job {run.name} arrived")
        # the first units of a job at t = 0 start loaded, as a one-job cluster starts configured
        if self.t == 0.0 and run.units:
            for s in w.slots.values():
                if s.pool == "elastic" and s.state == un.PREPARING:
                    s.state = un.IDLE
                    s.worker.gen += 1
        sim.feed(lp.Start(0.0))
        run.phase = (sim.training_active, sim.loop.step)

    def _end(self, run: JobRun) -> None:
        """The job's last update is published: it stops, its units go to the others."""
        sim = run.sim
        tl = run.local(self.t)
        sim.t = tl
        sim.feed(lp.Stop(tl))
        sim.heap.clear()
        run.ended = True
        for s in sim.world.slots.values():
            s.lent = False
        if run.units:
            sim.world.set_elastic_units(tl, 0)
            run.units = 0
        self.divide(f"job {run.name} ended")

    def run(self) -> MultiResult:
        wall0 = _time.perf_counter()
        sc = self.sc
        for r in self.runs:
            self._push(r.spec.arrival_s, _G_ARRIVE, r.name)
        for tt, g in sc.trace.changes(sc.duration_s):
            self._push(tt, _G_TRACE, g)
        self._push(sc.duration_s, _G_STOP)
        while True:
            t_job, nxt = math.inf, None
            for r in self.runs:
                if r.started and r.sim.heap:
                    tj = r.spec.arrival_s + r.sim.heap[0][0]
                    if tj < t_job:
                        t_job, nxt = tj, r
            if self.heap and self.heap[0][0] <= t_job:
                t, _, kind, a = heapq.heappop(self.heap)
                self.t = t
                if kind == _G_STOP:
                    break
                if kind == _G_ARRIVE:
                    self._start(self.by_name[a])
                else:
                    cap = self._units_of(a)
                    if cap != self.capacity:
                        old, self.capacity = self.capacity, cap
                        self.divide(f"capacity {old * self.unit}→{cap * self.unit} GPUs")
                continue
            if nxt is None:
                break
            self.t = t_job
            nxt.sim.advance(nxt.sim.heap[0][0])  # its own time: arrival + t - arrival may round below it
            if nxt.spec.steps and sum(1 for s in nxt.sim.steps if s.train_end_s > 0) >= nxt.spec.steps:
                self._end(nxt)
                continue
            phase = (nxt.sim.training_active, nxt.sim.loop.step)
            if phase != nxt.phase:
                old_phase, nxt.phase = nxt.phase, phase
                if phase[0] != old_phase[0]:
                    why = "Training Begin" if phase[0] else "Training Finished"
                else:
                    why = f"step {phase[1]} started"
                self.divide(f"{nxt.name} {why}")
        self.t = sc.duration_s
        self.divide("end")
        return self._result(_time.perf_counter() - wall0)

    def _result(self, wall: float) -> MultiResult:
        sc = self.sc
        jobs: dict[str, JobResult] = {}
        trained_total = 0
        for r in self.runs:
            if not r.started:
                jobs[r.name] = JobResult(r.name, 0.0, 0, None, 0, 0, 0)
                continue
            res = r.sim._result(0.0)
            r.result = res
            trained = [s for s in r.sim.steps if s.train_end_s > 0]
            tokens = sum(s.train_tokens for s in trained)
            trained_total += tokens
            warm = sc.engine.warmup_steps
            step_s = None
            if len(trained) - 1 > warm:
                step_s = round((trained[-1].train_end_s - trained[warm].train_end_s) / (len(trained) - 1 - warm), 3)
            window = sc.duration_s - r.spec.arrival_s
            if r.ended:  # it stopped after its last update: nothing was left to prorate
                window = trained[-1].train_end_s
            prorated = tokens * window / trained[-1].train_end_s if trained and trained[-1].train_end_s > 0 else 0.0
            jobs[r.name] = JobResult(
                r.name,
                res.throughput_tok_s,
                res.steps,
                step_s,
                tokens,
                res.return_deadline_misses,
                res.lost_tokens,
                round(prorated, 1),
            )
        training = sum(j.training_gpus for j in sc.jobs)
        gpu_hours = (training * sc.duration_s + sc.trace.mean(sc.duration_s) * sc.duration_s) / 3600.0
        return MultiResult(
            sc.name,
            self.sharing.value,
            sc.seed,
            jobs,
            trained_total,
            gpu_hours,
            self.reallocations,
            self.lent_gpu_s,
            self.explanations,
            wall,
        )


def run_multi(scenario: Scenario, policy: str, *, seed: int | None = None) -> MultiResult:
    return MultiSimulation(scenario, policy, seed=seed).run()


def compare_multi(scenario: Scenario, policies: list[str] | None = None) -> dict[str, MultiResult]:
    """Every sharing policy on the same seed; `static` always runs (the reference of jain and slowdown)."""
    wanted = list(policies or scenario.policies)
    unknown = [p for p in wanted if p not in SHARING_NAMES]
    if unknown:
        raise ValueError(f"unknown multi-job policy {unknown}; known: {', '.join(SHARING_NAMES)}")
    order = [Sharing.STATIC.value] + [p for p in wanted if p != Sharing.STATIC.value]
    out = {p: run_multi(scenario, p) for p in order}
    return {p: out[p] for p in order if p in wanted or p == Sharing.STATIC.value}


def compare_multi_json(scenario: Scenario, results: dict[str, MultiResult]) -> dict[str, Any]:
    static = results.get(Sharing.STATIC.value)
    return {
        "scenario": scenario.name,
        "seed": scenario.seed,
        "jobs": [j.name for j in scenario.jobs],
        "policies": {p: r.summary(static) for p, r in results.items()},
    }


def multi_table(scenario: Scenario, results: dict[str, MultiResult], wall: float) -> str:
    static = results.get(Sharing.STATIC.value)
    lines = [f"scenario {scenario.name} (seed {scenario.seed}, {len(scenario.jobs)} jobs) — {wall:.1f} s wall"]
    for p, r in results.items():
        s = r.summary(static)
        lines.append(
            f"{p:7s} cost_eff {s['cost_efficiency']:10,.1f} tok/GPU-h "
            f"(prorated {s['cost_efficiency_prorated']:10,.1f})  jain {s['jain']}  misses {s['misses']}  "
            f"reallocations {s['reallocations']}  lent {s['lent_gpu_s']:,.0f} GPU-s"
        )
        for n, j in s["jobs"].items():
            lines.append(
                f"    {n:10s} {j['throughput']:9,.0f} tok/s  steps {j['steps']:3d}  slowdown {j['slowdown']}  "
                f"vs static {j['vs_static']}"
            )
    return "\n".join(lines)


__all__ = ["JobResult", "MultiResult", "MultiSimulation", "compare_multi", "compare_multi_json", "run_multi"]
