"""Rollout scheduling policies behind one interface and one registry, used unchanged by the live
control plane and the simulator (`controlplane.sim`).

    policy = make_policy("pearl" | "fixed" | "fixed-large" | "elastic" | "oracle", profile=..., batch_size=...,
                         **options)       # options validated against the policy's OptionSpecs
    action = policy.on_event(ctx)          # on every elastic signal / budget change
    policy.observe(record)                 # feed a TelemetryRecord (runtime tracker input)

`PolicyContext` (core.context) describes the world at an elastic signal; `PolicyAction` is what the
policy wants: a target Configuration over the workers it will use (dedicated + borrowed overlap
workers), how many overlap (training-GPU) workers to borrow, and the Decision that explains it.

`POLICIES` below is the one list of policy names, what each is, whether a user may run it as a
product policy, and its options (name, type, default, bounds): the API, the job form, the CLI, the
simulator's scenarios and the docs all read it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Mapping, Protocol

from controlplane.core.borrowing import GateResult, gate
from controlplane.core.context import AvailabilityPoint, Overrides, PolicyContext, Signal
from controlplane.core.decision import Decision, Thresholds, decide, evaluate
from controlplane.core.predictor import WorkloadProfile
from controlplane.core.profiles import EngineCoefficients, Profile
from controlplane.core.state import Configuration
from controlplane.core.telemetry import TelemetryRecord
from controlplane.core.tracker import FittedProfile, RuntimeTracker


@dataclass(frozen=True, slots=True)
class PolicyAction:
    target: Configuration  # over dedicated + borrowed workers
    borrow: int  # overlap workers to use as rollout workers
    decision: Decision  # explains the choice
    free_reconfiguration: bool = False  # oracle only: the executor applies it at zero cost


class Policy(Protocol):
    name: str

    def on_event(self, ctx: PolicyContext) -> PolicyAction: ...

    def observe(self, record: TelemetryRecord) -> None: ...

    def state(self) -> dict[str, Any]: ...

    def load_state(self, state: Mapping[str, Any]) -> None: ...


class OptionError(ValueError):
    """A policy option is unknown or out of bounds; `option` names it."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option


@dataclass(frozen=True, slots=True)
class OptionSpec:
    """One user-settable policy option (per job in the live system, per variant in a scenario)."""

    name: str
    kind: type  # int | float | bool
    default: Any
    help: str
    minimum: float | None = None
    maximum: float | None = None

    def parse(self, value: Any) -> Any:
        """Strict: JSON types only, bounds checked; OptionError names the option and the problem."""
        def bad(why: str) -> OptionError:
            return OptionError(self.name, f"policy option {self.name} {why}")

        if value is None:
            if self.default is None:
                return None
            raise bad("may not be null")
        if self.kind is bool:
            if not isinstance(value, bool):
                raise bad("must be true or false")
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad("must be a number")
        if not math.isfinite(float(value)):
            raise bad("must be finite")
        if self.kind is int and not float(value).is_integer():
            raise bad("must be an integer")
        v = self.kind(value)
        if self.minimum is not None and v < self.minimum:
            raise bad(f"must be >= {self.minimum:g}")
        if self.maximum is not None and v > self.maximum:
            raise bad(f"must be <= {self.maximum:g}")
        return v


_TH = Thresholds()  # the default hysteresis thresholds


class _TrackedPolicy:
    """Shared by every policy: a RuntimeTracker fed by observe()."""

    name: ClassVar[str] = "base"
    summary: ClassVar[str] = ""
    product: ClassVar[bool] = True  # False: a reference for reports, not runnable as a job's policy
    options: ClassVar[tuple[OptionSpec, ...]] = ()

    def __init__(self, *, profile: Profile, batch_size: int, workload: WorkloadProfile | None = None,
                 tracker: RuntimeTracker | None = None, max_trajectory_tokens: int | None = None) -> None:
        if batch_size <= 0:
            raise ValueError("batch_size must be > 0")
        self.profile = profile
        self.batch_size = batch_size
        self.tracker = tracker or RuntimeTracker(profile, workload, batch_size=batch_size,
                                                 max_trajectory_tokens=max_trajectory_tokens)
        self.last_action: PolicyAction | None = None

    def observe(self, record: TelemetryRecord) -> None:
        self.tracker.observe(record)

    def state(self) -> dict[str, Any]:
        """What the policy carries from one signal to the next beyond its telemetry (JSON). The live
        planner rebuilds a policy per signal from stored telemetry and this; the simulator keeps one."""
        return {}

    def load_state(self, state: Mapping[str, Any]) -> None:
        return None

    def fitted(self, ctx: PolicyContext) -> tuple[WorkloadProfile, EngineCoefficients, FittedProfile]:
        fp = self.tracker.fitted()
        w = fp.workload
        if ctx.batch_size > 0 and ctx.batch_size != w.batch_size:
            w = replace(w, batch_size=ctx.batch_size)
        return w, fp.coefficients, fp

    def _dedicated(self, ctx: PolicyContext) -> int:
        return ctx.dedicated_workers if ctx.overrides.elasticity else min(ctx.reserved_workers, ctx.dedicated_workers)

    def _act(self, target: Configuration, borrow: int, decision: Decision, free: bool = False) -> PolicyAction:
        action = PolicyAction(target=target, borrow=borrow, decision=decision, free_reconfiguration=free)
        self.last_action = action
        return action


def _with(decision: Decision, **inputs: Any) -> Decision:
    return replace(decision, inputs={**decision.inputs, **inputs})


class PearlPolicy(_TrackedPolicy):
    """The paper: PD-adaptive decision on every signal + gated borrowing of overlap workers.

    `gate=False` borrows every idle overlap worker without Eq. 7 (the ablation's component B
    without C, paper Fig. 7); the decision engine and tracker are unchanged.
    """

    name = "pearl"
    summary = "PEARL: PD mode and P:D ratio from the online makespan predictor, gated borrowing, elasticity"
    options = (
        OptionSpec("gate", bool, True, "apply the Eq. 7 borrowing gate (false: borrow every idle window; ablation)"),
        OptionSpec("ratio_change", float, _TH.ratio_change,
                   "hysteresis: minimum predicted gain to change the P:D ratio", 0.0, 1.0),
        OptionSpec("mode_switch", float, _TH.mode_switch,
                   "hysteresis: minimum predicted gain to switch colocated <-> disaggregated", 0.0, 1.0),
        OptionSpec("mode_trial", bool, True,
                   "start colocated and enter a mode never run yet only as a one-step trial at a step start, once "
                   "the workload is fitted (false: follow the closed form from the first decision)"),
    )

    def __init__(self, *, gate: bool = True, ratio_change: float = _TH.ratio_change,
                 mode_switch: float = _TH.mode_switch, mode_trial: bool = True, **kw: Any) -> None:
        super().__init__(**kw)
        self.gated = gate
        self.thresholds = Thresholds(ratio_change, mode_switch)
        self.mode_trial = mode_trial

    def _thresholds(self, ctx: PolicyContext, fp: FittedProfile) -> tuple[Thresholds, str]:
        """The safeguard for a mode never run: its closed form has no measured correction yet, so it
        may be entered only as a bounded trial — at a step start (the whole step then scores it at
        constant resources, and the tracker learns the mode's own correction from that one step) and
        once the workload is fitted. At any other signal a switch into it is held back, and ratio
        changes within the running mode are still allowed. The worst case is one step in the worse
        mode per mode, ever."""
        th = self.thresholds
        cur, ov = ctx.current, ctx.overrides
        if not self.mode_trial or cur is None or cur.total <= 0 or ov.force_mode or ov.force_ratio is not None:
            return th, ""
        other = "colocated" if str(cur.mode) == "disaggregated" else "disaggregated"
        if self.tracker.mode_tried(other):
            return th, ""
        fitted = all(fp.estimates[k].fitted for k in ("S", "r", "delta_L") if k in fp.estimates)
        if ctx.signal is Signal.STEP_START and fitted:
            return th, f"{other} never run: a switch to it would be a one-step trial"
        return Thresholds(th.ratio_change, math.inf), f"{other} never run: no switch to it before a fitted step start"

    def _first_mode_is_the_baselines(self, ctx: PolicyContext, budget: int) -> bool:
        cur, ov = ctx.current, ctx.overrides
        return (self.mode_trial and budget > 0 and (cur is None or cur.total <= 0) and not ov.force_mode
                and ov.force_ratio is None and not self.tracker.mode_tried("colocated")
                and not self.tracker.mode_tried("disaggregated"))

    def on_event(self, ctx: PolicyContext) -> PolicyAction:
        w, c, fp = self.fitted(ctx)
        dedicated = self._dedicated(ctx)
        ov = ctx.overrides
        thresholds, trial_note = self._thresholds(ctx, fp)
        borrow, g = 0, None
        can_borrow = ov.borrowing and not ctx.training_active and ctx.overlap_workers > 0 \
            and ctx.signal is not Signal.TRAINING_BEGIN
        if can_borrow:
            if ctx.borrowed > 0:
                # activation already paid: keep them (returning early saves nothing, the return is due
                # anyway); borrow more only if the gate admits the extra workers
                borrow = min(ctx.borrowed, ctx.overlap_workers)
                if ctx.overlap_workers > borrow:
                    g = self._gate(w, c, ctx, dedicated + borrow, dedicated + ctx.overlap_workers)
                    if g.admit:
                        borrow = ctx.overlap_workers
            else:
                g = self._gate(w, c, ctx, dedicated, dedicated + ctx.overlap_workers)
                borrow = ctx.overlap_workers if g.admit else 0
        if ov.force_ratio is not None and ov.exact_ratio:
            borrow = min(borrow, max(0, sum(ov.force_ratio) - dedicated))  # borrow no GPU it would leave unused
        budget = dedicated + borrow
        current = ctx.current
        first = self._first_mode_is_the_baselines(ctx, budget)
        if first:
            # No mode has run yet, so neither closed form has a measured correction: start as the baseline
            # PEARL extends (colocated) and leave disaggregation to the bounded trial at a fitted step start.
            current = Configuration.colocated(budget)
            thresholds = Thresholds(thresholds.ratio_change, math.inf)
            trial_note = "no mode run yet: starting colocated, the baseline's mode; disaggregation only as a trial"
        d = decide(w, c, budget, current=current, overrides=ov, thresholds=thresholds)
        if first:
            split = d.candidates.best_disaggregated() if d.candidates is not None else None
            rated = f"; the unmeasured closed form rates {split.label} at {split.makespan_s:.1f} s" if split else ""
            d = replace(d, reason=f"First configuration: {d.configuration.label()} ({d.predicted_makespan_s:.1f} s). "
                                  f"No mode has run yet, so PEARL starts in the baseline's mode (colocated){rated}; "
                                  f"disaggregation is tried only for one step, at a fitted step start.")
        d = _with(d, signal=str(ctx.signal), dedicated=dedicated, borrow=borrow, gate=_gate_note(g, ctx),
                  confidence={k: round(e.confidence, 3) for k, e in fp.estimates.items()}, toggle_s=fp.toggle_s)
        if trial_note:
            d = _with(d, mode_trial=trial_note)
        d = replace(d, gate=g)
        return self._act(d.configuration, borrow, d)

    def _gate(self, w: WorkloadProfile, c: EngineCoefficients, ctx: PolicyContext, n_ded: int, n_full: int) -> GateResult:
        t_ded = _best_makespan(w, c, n_ded)
        t_full = _best_makespan(w, c, n_full)
        g = gate(remaining=ctx.remaining, batch_size=ctx.batch_size or w.batch_size, t_dedicated_s=t_ded,
                 t_full_s=t_full, toggle_s=self.tracker.toggle.value)
        if not self.gated:
            return replace(g, admit=True, reason=f"ungated (ablation): borrow; Eq. 7 would say: {g.reason}")
        return g


def _gate_note(g: GateResult | None, ctx: PolicyContext) -> str:
    """Why borrowing was (not) considered, for the decision record."""
    if g is not None:
        return g.reason
    if not ctx.overrides.borrowing:
        return "borrowing off (override)"
    if ctx.signal is Signal.TRAINING_BEGIN:
        return "Training Begin: borrowed workers return"
    if ctx.training_active:
        return "trainer computing: nothing to borrow"
    return "no overlap workers to borrow"


def _best_makespan(w: WorkloadProfile, c: EngineCoefficients, n: int) -> float:
    if n <= 0:
        return math.inf
    return decide(w, c, n).predicted_makespan_s


class FixedPolicy(_TrackedPolicy):
    """ROLL: a fixed rollout pool, colocated, no borrowing, no elasticity."""

    name = "fixed"
    summary = "ROLL: a fixed colocated rollout pool (the reserved GPUs unless `workers` is set), no borrowing"
    options = (OptionSpec("workers", int, None, "rollout workers in the fixed pool (default: the reserved pool)", 1, 65536),)

    def __init__(self, *, workers: int | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.workers = workers

    def _pool(self, ctx: PolicyContext) -> int:
        return self.workers if self.workers is not None else ctx.reserved_workers

    def on_event(self, ctx: PolicyContext) -> PolicyAction:
        w, c, _ = self.fitted(ctx)
        n = self._pool(ctx)
        cfg = Configuration.colocated(n)
        table = evaluate(w, c, n)
        pred = table.find(cfg)
        d = Decision(cfg, n, table, pred.makespan_s if pred else math.inf, None, cfg, 0.0, True, False, False,
                     f"{self.name}: fixed colocated pool of {n} workers ({cfg.label()}).",
                     {"signal": str(ctx.signal), "pool": n})
        return self._act(cfg, 0, d)


class FixedLargePolicy(FixedPolicy):
    """ROLL-Large: a fixed colocated pool the size of the trace's mean rollout GPUs, rounded up to a
    multiple of TP (paper: 14/10/12 GPUs for means 13.6/9.0/11.8)."""

    name = "fixed-large"
    summary = "ROLL-Large: a fixed colocated pool as large as the mean available rollout GPUs"
    options = (
        OptionSpec("workers", int, None, "rollout workers in the fixed pool", 1, 65536),
        OptionSpec("trace_mean_gpus", float, None, "mean rollout GPUs available (the pool is this, rounded up to TP)",
                   1.0, 1 << 20),
    )

    def __init__(self, *, trace_mean_gpus: float | None = None, workers: int | None = None, **kw: Any) -> None:
        profile: Profile = kw["profile"]
        if workers is None:
            if trace_mean_gpus is None:
                raise ValueError("fixed-large needs the option workers (pool size) or trace_mean_gpus")
            gpus = math.ceil(trace_mean_gpus / profile.tp - 1e-9) * profile.tp
            workers = gpus // profile.tp
        super().__init__(workers=workers, **kw)


class ElasticPolicy(_TrackedPolicy):
    """RLBoost+ (pearl_digest §8.1) adapted to asynchronous agentic RL, at its best:

    * inter-scale: every available preemptible GPU joins the rollout pool at once;
    * seeding = borrowing the training GPUs while the trainer is idle, *ungated*, for a window
      T_seed after Training Finished, adapted per step by Algorithm 1:
      T_seed ← T_seed + η·(t_train_wait − t_remote_wait), memoised per instance count
      (M[n_prem] written only when the count was stable during the step, reused when it changes);
    * colocated only (no PD adaptation); request-level balancing via `rlboost_rebalance`.

    t_train_wait: how long the trainer waited for rollout data after the seeding window closed;
    t_remote_wait: how long the trainer was held up by the return of seeding workers (the cost of
    seeding too long). In async RL the seeding window therefore grows to cover the idle period.
    """

    name = "elastic"
    summary = "RLBoost+: every preemptible GPU joins, training GPUs seeded for an adaptive window, colocated only"
    options = (
        OptionSpec("eta", float, 0.5, "Algorithm 1 step size for the seeding window", 1e-6, 100.0),
        OptionSpec("t_seed_s", float, 60.0, "initial seeding window after Training Finished, seconds", 0.0, 86400.0),
    )

    def __init__(self, *, eta: float = 0.5, t_seed_s: float = 60.0, **kw: Any) -> None:
        super().__init__(**kw)
        if eta <= 0:
            raise ValueError("eta must be > 0")
        self.eta = eta
        self.t_seed_s = t_seed_s
        self.memo: dict[int, float] = {}
        self._finished_at: float | None = None
        self._returned_at: float | None = None
        self._count_at_start: int | None = None
        self._count_stable = True

    _STATE = ("t_seed_s", "_finished_at", "_returned_at", "_count_at_start", "_count_stable")

    def state(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in self._STATE}, "memo": {str(n): v for n, v in self.memo.items()}}

    def load_state(self, state: Mapping[str, Any]) -> None:
        for k in self._STATE:
            if k in state:
                setattr(self, k, state[k])
        self.memo = {int(n): float(v) for n, v in (state.get("memo") or {}).items()}

    def on_event(self, ctx: PolicyContext) -> PolicyAction:
        w, c, _ = self.fitted(ctx)
        dedicated = self._dedicated(ctx)
        if self._count_at_start is None:
            self._count_at_start = dedicated
        elif dedicated != self._count_at_start:
            self._count_stable = False
            if dedicated in self.memo:
                self.t_seed_s = self.memo[dedicated]
        if ctx.signal is Signal.TRAINING_FINISHED:
            self._finished_at = ctx.now_s
            self._returned_at = None
        if ctx.signal is Signal.TRAINING_BEGIN:
            self._adapt(ctx, dedicated)
        borrow = 0
        seeding = (ctx.overrides.borrowing and not ctx.training_active and ctx.overlap_workers > 0
                   and ctx.signal is not Signal.TRAINING_BEGIN)
        if seeding:
            start = self._finished_at if self._finished_at is not None else ctx.now_s
            if self._finished_at is None:
                self._finished_at = ctx.now_s
            if ctx.now_s - start < self.t_seed_s:
                borrow = ctx.overlap_workers
            elif ctx.borrowed > 0 and self._returned_at is None:
                self._returned_at = ctx.now_s
        n = dedicated + borrow
        cfg = Configuration.colocated(n)
        table = evaluate(w, c, n)
        pred = table.find(cfg)
        d = Decision(cfg, n, table, pred.makespan_s if pred else math.inf, None, cfg, 0.0, True, False, False,
                     f"elastic (RLBoost+): colocated on {dedicated} dedicated + {borrow} seeding workers; "
                     f"T_seed {self.t_seed_s:.1f} s.",
                     {"signal": str(ctx.signal), "dedicated": dedicated, "borrow": borrow, "t_seed_s": self.t_seed_s})
        return self._act(cfg, borrow, d)

    def _adapt(self, ctx: PolicyContext, dedicated: int) -> None:
        """Algorithm 1 at Training Begin (the end of this step's idle window)."""
        if self._finished_at is None:
            return
        seed_end = self._returned_at if self._returned_at is not None else ctx.now_s
        t_train_wait = max(0.0, ctx.now_s - seed_end)  # trainer idle after seeding stopped
        # return overrunning Training Begin delays the trainer by the deactivation time
        t_remote_wait = self.profile.reconfig.intra_scale_deactivation_s if ctx.borrowed > 0 else 0.0
        self.t_seed_s = max(0.0, self.t_seed_s + self.eta * (t_train_wait - t_remote_wait))
        if self._count_stable and self._count_at_start is not None:
            self.memo[self._count_at_start] = self.t_seed_s
        self._count_at_start = dedicated
        self._count_stable = True
        self._finished_at = None
        self._returned_at = None


class RLBoostPolicy(ElasticPolicy):
    """RLBoost+ as close to RLBoost (NSDI'26) Algorithm 1 and its code (Terra-Flux/PolyRL rollout-manager)
    as asynchronous agentic RL allows. A reference baseline for reports, not in the registry (the live
    job API pins its policy list); the simulator builds it under the name `rlboost+`.

    Algorithm 1 (adaptive seeding), as in `balance.rs::adjust_local_instances_gen_s`:
    * seeding = the training GPUs serve rollout for T_seed after Training Finished (ungated);
    * at the end of each step T_seed ← max(5, T_seed + η·(t_train_wait − t_remote_wait)), η = 1/3;
      t_train_wait = trainer idle after seeding stopped, until Training Begin; t_remote_wait = what seeding
      cost the trainer: the return (deactivation) when seeding ran into Training Begin;
    * memo table M[n_remote] = T_seed, fed by step throughput: same count and throughput rose → the
      current T_seed is the peak; else M ← 0.8·peak + 0.2·M (α = 0.8); count changed → M[old] ←
      0.2·peak + 0.8·M[old] (β = 0.2), and T_seed jumps to M[new] when there is one;
    * cap on remote instances (paper): N_remote ≤ ⌈(t_remote·n_remote + T_seed·N_seed)/t_train⌉, the
      instances needed for rollout to take no longer than training (never below the reserved pool).
    Algorithm 2 (load balancing) is the loop's `jsq` dispatch (`LoopConfig.dispatch`, core.router): each
    turn is a request, sent to the worker with the fewest turns in flight (ties: the trajectory's home,
    which holds its prefix cache; RLBoost round-robins, having no multi-turn cache to keep), and held
    centrally while every worker has the throughput-plateau batch B in flight (delayed dispatch,
    `profiles.plateau_batch`); a held turn goes to the first worker below B, a worker that joins
    included (CONTINUOUSLB's pending migration). CONTINUOUSLB's move of r = max(m_exec − B, 0)
    executing requests to an idle worker never fires: dispatch never puts more than B on a worker.
    Token-level migration on preemption is the loop's (partial trajectories resume elsewhere after one
    re-prefill). Colocated only: no PD adaptation.
    """

    name = "rlboost+"
    summary = "RLBoost+: RLBoost Algorithm 1 (adaptive seeding, memo, remote cap) adapted to asynchronous RL"
    product = False
    ETA = 1.0 / 3.0
    FLOOR_S = 5.0
    ALPHA, BETA = 0.8, 0.2

    def __init__(self, *, eta: float = ETA, t_seed_s: float = 150.0, cap: bool = True, **kw: Any) -> None:
        super().__init__(eta=eta, t_seed_s=t_seed_s, **kw)
        self.cap = cap
        self._peak: tuple[float, float] | None = None  # (T_seed, throughput) best at the current count
        self._last_thr = 0.0
        self._memo_count: int | None = None
        self._t_remote = 0.0  # last rollout makespan
        self._t_train = 0.0  # last training step
        self._last_train_end: float | None = None
        self._step_tokens: dict[int, int] = {}

    _STATE = ElasticPolicy._STATE + ("_last_thr", "_memo_count", "_t_remote", "_t_train", "_last_train_end")

    def state(self) -> dict[str, Any]:
        return {**super().state(), "peak": list(self._peak) if self._peak else None}

    def load_state(self, state: Mapping[str, Any]) -> None:
        super().load_state(state)
        pk = state.get("peak")
        self._peak = (float(pk[0]), float(pk[1])) if pk else None

    def observe(self, record: TelemetryRecord) -> None:
        super().observe(record)
        kind = str(record.kind)
        if kind == "step" and record.makespan_s > 0:
            self._t_remote = record.makespan_s
            self._step_tokens[record.step] = record.generated_tokens_total + record.train_tokens
        elif kind == "train" and record.duration_s > 0:
            self._t_train = record.duration_s
            end = record.time_s
            tokens = self._step_tokens.pop(record.step, 0)
            if self._last_train_end is not None and end > self._last_train_end and tokens:
                self._memo_update(tokens / (end - self._last_train_end))
            self._last_train_end = end

    def _memo_update(self, thr: float) -> None:
        """The code's memo rule on one step's throughput (balance.rs)."""
        n = self._count_at_start
        if n is None:
            return
        if self._memo_count is not None and self._memo_count != n:  # count changed since the last step
            if self._peak is not None:
                old = self.memo.get(self._memo_count, self._peak[0])
                self.memo[self._memo_count] = self.BETA * self._peak[0] + (1 - self.BETA) * old
            self._peak = None
            self._last_thr = 0.0
        self._memo_count = n
        if thr > self._last_thr or self._peak is None:
            self._peak = (self.t_seed_s, thr)
        else:
            old = self.memo.get(n, self._peak[0])
            self.memo[n] = self.ALPHA * self._peak[0] + (1 - self.ALPHA) * old
        self._last_thr = thr

    def _adapt(self, ctx: PolicyContext, dedicated: int) -> None:
        memo_before = dict(self.memo)
        super()._adapt(ctx, dedicated)
        self.memo = memo_before  # the memo is written by throughput (_memo_update), not at every step
        self.t_seed_s = max(self.FLOOR_S, self.t_seed_s)

    def _dedicated(self, ctx: PolicyContext) -> int:
        n = super()._dedicated(ctx)
        if not self.cap or self._t_train <= 0 or self._t_remote <= 0:
            return n
        seeding = ctx.overlap_workers if ctx.overlap_workers > 0 else ctx.borrowed
        need = math.ceil((self._t_remote * n + self.t_seed_s * seeding) / self._t_train - 1e-9)
        return max(min(n, ctx.reserved_workers), min(n, need))


def rlboost_rebalance(pending: Mapping[int, int], executing: Mapping[int, int], plateau_batch: int) -> list[tuple[int, int, int]]:
    """RLBoost Algorithm 2 (CONTINUOUSLB): moves (src, dst, n) of requests between workers.

    If some worker has no pending request while others do, migrate one pending request from the
    worker with most pending; else if some worker is fully idle, move max(m_exec − plateau, 0)
    executing requests off the busiest worker.
    """
    workers = sorted(set(pending) | set(executing))
    if len(workers) < 2:
        return []
    pend = {w: pending.get(w, 0) for w in workers}
    exe = {w: executing.get(w, 0) for w in workers}
    moves: list[tuple[int, int, int]] = []
    empty = [w for w in workers if pend[w] == 0]
    loaded = [w for w in workers if pend[w] > 0]
    if empty and loaded:
        src = max(loaded, key=lambda w: (pend[w], -w))
        dst = min(empty, key=lambda w: (exe[w], w))
        moves.append((src, dst, 1))
        return moves
    idle = [w for w in workers if pend[w] == 0 and exe[w] == 0]
    if idle:
        src = max(workers, key=lambda w: (exe[w], -w))
        n = max(exe[src] - plateau_batch, 0)
        if n > 0 and src != idle[0]:
            moves.append((src, idle[0], n))
    return moves


class OraclePolicy(_TrackedPolicy):
    """Upper bound: knows the future availability and reconfigures for free.

    With free reconfiguration the best plan is the best configuration for each constant-budget
    interval, with no hysteresis and borrowing whenever it helps at all (T_toggle = 0). It uses
    `ctx.future` to report the step's predicted makespan over the coming availability changes.
    Never a product default.
    """

    name = "oracle"
    summary = "Upper bound: knows the future availability and reconfigures for free (reports only)"
    product = False

    def on_event(self, ctx: PolicyContext) -> PolicyAction:
        w, c, _ = self.fitted(ctx)
        dedicated = self._dedicated(ctx)
        borrow = 0
        if ctx.overrides.borrowing and not ctx.training_active and ctx.overlap_workers > 0 \
                and ctx.signal is not Signal.TRAINING_BEGIN:
            if _best_makespan(w, c, dedicated + ctx.overlap_workers) < _best_makespan(w, c, dedicated):
                borrow = ctx.overlap_workers
        n = dedicated + borrow
        d = decide(w, c, n, current=None, overrides=ctx.overrides, thresholds=Thresholds(0.0, 0.0))
        horizon = self._over_future(w, c, ctx, borrow)
        d = _with(d, signal=str(ctx.signal), dedicated=dedicated, borrow=borrow, step_makespan_over_future_s=horizon)
        return self._act(d.configuration, borrow, d, free=True)

    def _over_future(self, w: WorkloadProfile, c: EngineCoefficients, ctx: PolicyContext, borrow: int) -> float:
        """Fluid estimate: the step's work drains at rate 1/T(best config) of the budget in force."""
        points = sorted((p for p in ctx.future if p.time_s >= ctx.now_s), key=lambda p: p.time_s)
        left, t, n = 1.0, ctx.now_s, self._dedicated(ctx) + borrow
        for p in points:
            rate = 1.0 / _best_makespan(w, c, n) if n > 0 else 0.0
            dt = p.time_s - t
            if rate * dt >= left:
                return t + left / rate - ctx.now_s
            left -= rate * dt
            t, n = p.time_s, p.dedicated_workers + borrow
        rate = 1.0 / _best_makespan(w, c, n) if n > 0 else 0.0
        return (t + left / rate - ctx.now_s) if rate > 0 else math.inf


POLICIES: dict[str, type[_TrackedPolicy]] = {
    cls.name: cls for cls in (PearlPolicy, FixedPolicy, FixedLargePolicy, ElasticPolicy, OraclePolicy)
}
POLICY_ALIASES: dict[str, str] = {"roll": "fixed", "roll-large": "fixed-large", "rlboost+": "elastic"}
POLICY_NAMES: tuple[str, ...] = tuple(POLICIES)
PRODUCT_POLICIES: tuple[str, ...] = tuple(n for n, c in POLICIES.items() if c.product)


def policy_class(name: str) -> type[_TrackedPolicy]:
    key = str(name).strip().lower()
    cls = POLICIES.get(POLICY_ALIASES.get(key, key))
    if cls is None:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICY_NAMES)}")
    return cls


def validate_options(name: str, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The user-settable options of policy `name`, parsed strictly (OptionError names the option)."""
    cls = policy_class(name)
    specs = {o.name: o for o in cls.options}
    out: dict[str, Any] = {}
    for key, value in (options or {}).items():
        spec = specs.get(key)
        if spec is None:
            raise OptionError(str(key), f"{key!r} is not an option of policy {cls.name!r} "
                                        f"(its options: {', '.join(specs) or 'none'})")
        out[key] = spec.parse(value)
    if cls is FixedLargePolicy and out.get("workers") is None and out.get("trace_mean_gpus") is None:
        raise OptionError("workers", "fixed-large needs its pool size: the option workers (or trace_mean_gpus)")
    return out


def make_policy(name: str, *, profile: Profile, batch_size: int, workload: WorkloadProfile | None = None,
                tracker: RuntimeTracker | None = None, max_trajectory_tokens: int | None = None,
                **options: Any) -> Policy:
    """Build a policy by name (or alias) with its validated options (see `POLICIES[name].options`)."""
    cls = policy_class(name)
    return cls(profile=profile, batch_size=batch_size, workload=workload, tracker=tracker,
               max_trajectory_tokens=max_trajectory_tokens, **validate_options(name, options))
