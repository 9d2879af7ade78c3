"""The baselines PEARL is compared with: ROLL's fixed pools (ROLL, ROLL-Large), elastic seeding after
RLBoost (the ablation's B without A and C) and RLBoost+ (RLBoost's Algorithms 1 and 2 adapted to
asynchronous RL, a simulator-only reference). Their names are in `names`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

from controlplane.core.context import PolicyContext, Signal
from controlplane.core.decision import Decision, evaluate
from controlplane.core.policies import names
from controlplane.core.policies.base import OptionError, OptionSpec, PolicyAction, StaticPool, TrackedPolicy
from controlplane.core.predictor import WorkloadProfile
from controlplane.core.profiles import EngineCoefficients, Profile
from controlplane.core.state import Configuration
from controlplane.core.telemetry import TelemetryRecord


def fixed_decision(
    workload: WorkloadProfile, coeffs: EngineCoefficients, cfg: Configuration, reason: str, inputs: dict[str, Any]
) -> Decision:
    """A baseline's choice of `cfg` as a `Decision`: made without the engine's rules, so always admitted, never
    forced, `cfg` its own best; its predicted makespan the engine's (inf where the table has no such row)."""
    table = evaluate(workload, coeffs, cfg.total)
    pred = table.find(cfg)
    ms = pred.makespan_s if pred else math.inf
    return Decision(cfg, cfg.total, table, ms, None, cfg, 0.0, True, False, False, reason, inputs)


class FixedPolicy(TrackedPolicy):
    """ROLL: a fixed rollout pool, colocated, no borrowing, no elasticity."""

    name = names.FIXED
    summary = "ROLL: a fixed colocated rollout pool (the reserved GPUs unless `workers` is set), no borrowing"
    options: ClassVar[tuple[OptionSpec, ...]] = (
        OptionSpec("workers", int, None, "rollout workers in the fixed pool (default: the reserved pool)", 1, 65536),
    )
    static_pool = StaticPool.RESERVED
    color = "#7f7f7f"

    def __init__(self, *, workers: int | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.workers = workers

    def _pool(self, ctx: PolicyContext) -> int:
        return self.workers if self.workers is not None else ctx.reserved_workers

    def on_event(self, ctx: PolicyContext) -> PolicyAction:
        w, c, _ = self.fitted(ctx)
        n = self._pool(ctx)
        cfg = Configuration.colocated(n)
        reason = f"{self.name}: fixed colocated pool of {n} workers ({cfg.label()})."
        return self._act(cfg, 0, fixed_decision(w, c, cfg, reason, {"signal": str(ctx.signal), "pool": n}))


class FixedLargePolicy(FixedPolicy):
    """ROLL-Large: a fixed colocated pool the size of the trace's mean rollout GPUs, rounded up to a
    multiple of TP (paper: 14/10/12 GPUs for means 13.6/9.0/11.8)."""

    name = names.FIXED_LARGE
    summary = "ROLL-Large: a fixed colocated pool as large as the mean available rollout GPUs"
    static_pool = StaticPool.TRACE_MEAN
    color = "#1f77b4"
    options: ClassVar[tuple[OptionSpec, ...]] = (
        OptionSpec("workers", int, None, "rollout workers in the fixed pool", 1, 65536),
        OptionSpec(
            "trace_mean_gpus",
            float,
            None,
            "mean rollout GPUs available (the pool is this, rounded up to TP)",
            1.0,
            1 << 20,
        ),
    )

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        if options.get("workers") is None and options.get("trace_mean_gpus") is None:
            raise OptionError("workers", f"{cls.name} needs its pool size: the option workers (or trace_mean_gpus)")

    def __init__(self, *, trace_mean_gpus: float | None = None, workers: int | None = None, **kw: Any) -> None:
        profile: Profile = kw["profile"]
        if workers is None:
            if trace_mean_gpus is None:
                raise ValueError(f"{self.name} needs the option workers (pool size) or trace_mean_gpus")
            gpus = math.ceil(trace_mean_gpus / profile.tp - 1e-9) * profile.tp
            workers = gpus // profile.tp
        super().__init__(workers=workers, **kw)


class ElasticPolicy(TrackedPolicy):
    """Elastic seeding after RLBoost (docs/research/pearl_digest.md §8.1), adapted to async agentic RL, at its best:

    * inter-scale: every available preemptible GPU joins the rollout pool at once;
    * seeding = borrowing the training GPUs while the trainer is idle, *ungated*, for a window
      T_seed after Training Finished, adapted per step by Algorithm 1:
      T_seed ← T_seed + η·(t_train_wait − t_remote_wait), memoised per instance count
      (M[n_prem] written only when the count was stable during the step, reused when it changes);
    * colocated only (no PD adaptation); request-level balancing via `rlboost_rebalance`.

    t_train_wait: how long the trainer waited for rollout data after the seeding window closed;
    t_remote_wait: how long the trainer was held up by the return of seeding workers (the cost of
    seeding too long). In async RL the seeding window therefore grows to cover the idle period.

    It is the product's RLBoost-like baseline (the B-only ablation: ungated borrowing for the whole idle
    window); `RLBoostPolicy` below is RLBoost's own algorithm, for the simulator's reports.
    """

    name = names.ELASTIC
    summary = (
        "Elastic seeding after RLBoost: every preemptible GPU joins, training GPUs seeded for an adaptive "
        "window, colocated only"
    )
    color = "#2ca02c"
    options: ClassVar[tuple[OptionSpec, ...]] = (
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

    _STATE: ClassVar[tuple[str, ...]] = ("t_seed_s", "_finished_at", "_returned_at", "_count_at_start", "_count_stable")

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
        seeding = (
            ctx.overrides.borrowing
            and not ctx.training_active
            and ctx.overlap_workers > 0
            and ctx.signal is not Signal.TRAINING_BEGIN
        )
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
        reason = (
            f"{self.name}: colocated on {dedicated} dedicated + {borrow} seeding workers; T_seed {self.t_seed_s:.1f} s."
        )
        inputs = {"signal": str(ctx.signal), "dedicated": dedicated, "borrow": borrow, "t_seed_s": self.t_seed_s}
        return self._act(cfg, borrow, fixed_decision(w, c, cfg, reason, inputs))

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
    as asynchronous agentic RL allows. A reference baseline for the simulator's reports: in the registry,
    neither a product policy nor listed in the catalog (the live job API pins its policy list).

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

    name = names.RLBOOST
    summary = "RLBoost+: RLBoost Algorithm 1 (adaptive seeding, memo, remote cap) adapted to asynchronous RL"
    product = False
    listed = False
    dispatch = "jsq"  # Algorithm 2
    ETA = 1.0 / 3.0
    FLOOR_S = 5.0
    ALPHA, BETA = 0.8, 0.2
    options: ClassVar[tuple[OptionSpec, ...]] = (
        OptionSpec("eta", float, ETA, "Algorithm 1 step size for the seeding window", 1e-6, 100.0),
        OptionSpec("t_seed_s", float, 150.0, "initial seeding window after Training Finished, seconds", 0.0, 86400.0),
        OptionSpec("cap", bool, True, "cap the remote instances at what keeps rollout no longer than training"),
    )

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

    _STATE: ClassVar[tuple[str, ...]] = (
        *ElasticPolicy._STATE,
        "_last_thr",
        "_memo_count",
        "_t_remote",
        "_t_train",
        "_last_train_end",
    )

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


def rlboost_rebalance(
    pending: Mapping[int, int], executing: Mapping[int, int], plateau_batch: int
) -> list[tuple[int, int, int]]:
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
