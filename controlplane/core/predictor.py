"""Rollout-batch makespan predictor (paper §3, Eq. 1–3) with the capacity constraints.

The predictor answers: how long until the last of B trajectories finishes under configuration π?
It returns the parts (prefill, decode, KV transfer, environment, overhead) so the dashboard can
explain a decision, and whether π is feasible. The vectorised `disaggregated_table` evaluates every
split N_P = 1..N−1 in closed form at once, which keeps `decide()` O(N) numpy work.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from controlplane.core.profiles import EngineCoefficients, get_profile
from controlplane.core.state import Configuration, Mode


@dataclass(frozen=True, slots=True)
class WorkloadProfile:
    """The workload side of the predictor (paper §3 symbols), per rollout step.

    `kv_seq_tokens` is the KV a trajectory holds at its peak (K_seq / K): its prompt plus S turns of
    ΔL + r. `mean_context` is the mean context a decode iteration reads (sets b); `prefix_tokens` the
    mean cached prefix a turn's prefill attends over (sets t_prefill's attention term).
    """

    batch_size: int  # B
    turns: float  # S, turns of the slowest trajectory
    new_prompt_tokens: float  # ΔL
    generated_tokens: float  # r
    env_time_s: float  # T_env along the slowest trajectory
    theta: float  # θ = (1−f)/f, decode bubble ratio
    kv_seq_tokens: float  # K_seq / K
    mean_context: float  # L̄ for decode KV reads
    prefix_tokens: float = 0.0  # mean cached prefix at a turn's prefill
    overhead_s: float = 0.0  # T_over per turn under colocation
    # Online correction of the closed forms, per mode: observed / predicted makespan of recent steps
    # (the runtime tracker fits them; 1.0 = the raw Eq. 1–3). Like the correction factors of Dynamo's
    # planner, it absorbs what the closed forms leave out (stragglers at the length cap, the decode batch
    # draining to the tail) without changing the shape of the model.
    scale_colocated: float = 1.0
    scale_disaggregated: float = 1.0
    # ΔL under disaggregation. A prefill worker never saw the previous turn's response (a decode
    # worker generated it), so every turn re-prefills it: ΔL_dis ≈ ΔL_coloc + r. None: the same ΔL for
    # both modes (a prior whose ΔL already counts the re-sent response, as `swe_bench_workload`'s does).
    new_prompt_tokens_disaggregated: float | None = None
    # Trajectories whose KV the decode pool holds at once. None: all B (the paper's literal, worst-case
    # B·K_seq ≤ N_D·H_max); the runtime tracker sets the expected concurrency B·f once f is measured
    # (a turn's KV leaves the decode worker when the turn ends: environment, queueing and prefill
    # time hold none there).
    kv_concurrency: float | None = None

    def __post_init__(self) -> None:
        if self.batch_size < 0 or self.turns < 0 or self.theta < 0:
            raise ValueError("batch_size, turns and theta must be >= 0")
        if self.kv_concurrency is not None and self.kv_concurrency < 0:
            raise ValueError("kv_concurrency must be >= 0")

    @property
    def f(self) -> float:
        """Active-decode fraction f = 1/(1+θ)."""
        return 1.0 / (1.0 + self.theta)

    @property
    def delta_l_disaggregated(self) -> float:
        """ΔL per turn on a prefill worker (see `new_prompt_tokens_disaggregated`)."""
        d = self.new_prompt_tokens_disaggregated
        return self.new_prompt_tokens if d is None else d

    @property
    def decode_kv_sequences(self) -> float:
        """How many trajectories' KV (K_seq each) the decode-holding workers must fit at once."""
        c = self.kv_concurrency
        return float(self.batch_size) if c is None else min(float(self.batch_size), c)


# ΔL : r for the SWE-bench-like workload: the paper's own measurement (prefill handles 96.68% of
# tokens, Qwen3-30B-A3B on SWE-bench, docs/research/pearl_digest.md §1), the only one it gives, used for every model.
# The tracker refits ΔL and r online.
SWE_BENCH_PROMPT_TO_GENERATED = 96.68 / 3.32


def swe_bench_workload(
    batch_size: int = 64,
    max_trajectory_tokens: int = 32768,
    *,
    prompt_to_generated: float = SWE_BENCH_PROMPT_TO_GENERATED,
) -> WorkloadProfile:
    """The prior: the SWE-bench-like workload of the paper's evaluation (values and reasons in PROFILES.md).

    S = 25 turns for the slowest trajectory, which reaches ~96% of the trajectory cap; per turn
    ΔL : r new prompt tokens (tool output + re-sent response) to generated tokens (tool calls with
    short reasoning), the paper's measured 29.1 : 1; θ = 0.35 (f ≈ 0.74 of decode slots busy); 2 s of
    tool time per turn (T_env = 50 s; it shifts every candidate equally, so it never changes the chosen
    split). T_over is 0: no telemetry measures a per-turn colocation overhead and no source gives one
    (PROFILES.md §5), so the prior carries none. K_seq is a full-length trajectory (the decode pool must
    hold any trajectory up to the cap); decode and prefill see half the cap on average.
    """
    ratio = prompt_to_generated
    if ratio <= 0:
        raise ValueError("prompt_to_generated must be > 0")
    turns = 25.0
    per_turn = 0.96 * max_trajectory_tokens / turns
    return WorkloadProfile(
        batch_size=batch_size,
        turns=turns,
        new_prompt_tokens=per_turn * ratio / (ratio + 1.0),
        generated_tokens=per_turn / (ratio + 1.0),
        env_time_s=2.0 * turns,
        theta=0.35,
        kv_seq_tokens=float(max_trajectory_tokens),
        mean_context=max_trajectory_tokens / 2.0,
        prefix_tokens=max_trajectory_tokens / 2.0,
        overhead_s=0.0,
    )


@dataclass(frozen=True, slots=True)
class FeasibilityRule:
    """Capacity constraints (paper §3) and the prefill keep-up rule we chose (paper gives none).

    Prefill keeps up iff T_prefill ≤ κ·T_decode: past that point the prefill pool is a saturated queue
    (M/D/1 delay → ∞ as ρ → 1) and decode workers idle more than they work. κ = 1.5 keeps splits
    where prefill is the (mild) bottleneck, which the max() in Eq. 2–3 already prices.
    """

    prefill_keepup: float = 1.5  # κ


@dataclass(frozen=True, slots=True)
class Prediction:
    """One configuration's predicted makespan and its parts (seconds)."""

    configuration: Configuration
    makespan_s: float
    prefill_s: float
    decode_s: float
    kv_transfer_s: float
    env_s: float
    overhead_s: float
    feasible: bool
    why_infeasible: str = ""
    correction: float = 1.0  # makespan = correction × (the raw closed form the parts add up to)

    @property
    def label(self) -> str:
        return self.configuration.label()


def kv_need_bytes(workload: WorkloadProfile, coeffs: EngineCoefficients) -> float:
    """Decode KV the pool must hold: (B, or the expected concurrency B·f once measured)·K_seq."""
    return workload.decode_kv_sequences * workload.kv_seq_tokens * coeffs.kv_bytes_per_token


def kv_fits(workload: WorkloadProfile, coeffs: EngineCoefficients, workers: int) -> bool:
    """B·K_seq ≤ N·H_max over the workers that hold the decode KV (B → B·f: `kv_concurrency`)."""
    return kv_need_bytes(workload, coeffs) <= workers * coeffs.hbm_kv_capacity


def min_workers_for_kv(workload: WorkloadProfile, coeffs: EngineCoefficients) -> int:
    need = kv_need_bytes(workload, coeffs)
    return max(1, int(np.ceil(need / coeffs.hbm_kv_capacity - 1e-9)))


def predict_colocated(workload: WorkloadProfile, coeffs: EngineCoefficients, n: int) -> Prediction:
    """Eq. 1: T_coloc = S·[(B·ΔL/N)·t_prefill·I + r·(A + b·B/N) + T_over] + T_env.

    I (`prefill_interference`) is what a prefill costs next to running decodes over what it costs
    alone; the paper's Eq. 1 has I = 1 (the decodes wait out the prefill: additive interference)."""
    w = workload
    config = Configuration.colocated(n)
    if n <= 0:
        return Prediction(config, float("inf"), 0.0, 0.0, 0.0, w.env_time_s, 0.0, False, "no workers")
    prefill = w.turns * w.batch_size * w.new_prompt_tokens / n * coeffs.t_prefill * coeffs.prefill_interference
    decode = w.turns * w.generated_tokens * float(coeffs.decode_iteration_s(w.batch_size / n))
    overhead = w.turns * w.overhead_s
    makespan = (prefill + decode + overhead + w.env_time_s) * w.scale_colocated
    fits = kv_fits(w, coeffs, n)
    return Prediction(
        config,
        makespan,
        prefill,
        decode,
        0.0,
        w.env_time_s,
        overhead,
        fits,
        "" if fits else "KV of the batch exceeds the workers' HBM",
        w.scale_colocated,
    )


def _disagg_arrays(
    workload: WorkloadProfile,
    coeffs: EngineCoefficients,
    n_prefill: np.ndarray,
    n_decode: np.ndarray,
    decode_coeffs: EngineCoefficients | None = None,
    link_bandwidth: float | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | float]:
    """Eq. 2 and 3 for arrays of splits: (prefill compute, KV transfer, decode) seconds.

    `coeffs` prices the prefill pool; `decode_coeffs` (default: the same) the decode pool, on another chip
    type in a cross-type split; `link_bandwidth` (default: `coeffs.bandwidth`) is one worker-to-worker KV link."""
    w = workload
    dec = coeffs if decode_coeffs is None else decode_coeffs
    bw = coeffs.bandwidth if link_bandwidth is None else link_bandwidth
    tokens = w.turns * w.batch_size * w.delta_l_disaggregated  # λ_P = B·S·ΔL (ΔL as a prefill worker sees it)
    prefill = tokens * coeffs.t_prefill / n_prefill  # Eq. 3 compute part
    # Eq. 3 transfer part (lower bound). Default: every prefill worker sends its own KV over its own NICs,
    # so the inter-pool bandwidth is min(N_P, N_D) worker links; `shared_kv_fabric` takes BW as one fixed
    # pool-to-pool bandwidth, the paper's literal reading (PROFILES.md discusses both).
    links = np.ones_like(n_prefill) if coeffs.shared_kv_fabric else np.minimum(n_prefill, n_decode)
    kv = tokens * coeffs.kv_bytes_per_token / (bw * links)
    one = 1.0 + w.theta
    per_iter = dec.decode_iteration_s(w.batch_size / (n_decode * one))
    decode = w.turns * w.generated_tokens * per_iter * one  # Eq. 2
    return prefill, kv, decode


def predict_disaggregated(
    workload: WorkloadProfile,
    coeffs: EngineCoefficients,
    n_prefill: int,
    n_decode: int,
    rule: FeasibilityRule = FeasibilityRule(),
) -> Prediction:
    """Eq. 2–3: T_dis = max(T_prefill, T_decode) + T_env with the capacity constraints."""
    config = Configuration.disaggregated(n_prefill, n_decode)
    p, kv, d = _disagg_arrays(workload, coeffs, np.asarray(float(n_prefill)), np.asarray(float(n_decode)))
    prefill, kvs, decode = float(p), float(kv), float(d)
    makespan = (max(prefill + kvs, decode) + workload.env_time_s) * workload.scale_disaggregated
    why = _why(workload, coeffs, n_decode, prefill + kvs, decode, rule)
    return Prediction(
        config, makespan, prefill, decode, kvs, workload.env_time_s, 0.0, not why, why, workload.scale_disaggregated
    )


def _why(
    w: WorkloadProfile, c: EngineCoefficients, n_decode: int, t_pre: float, t_dec: float, rule: FeasibilityRule
) -> str:
    if not kv_fits(w, c, n_decode):
        return "decode KV does not fit: B·K_seq > N_D·H_max"
    if t_pre > rule.prefill_keepup * t_dec:
        return f"prefill cannot keep up: T_prefill > {rule.prefill_keepup:g}·T_decode"
    return ""


@dataclass(frozen=True, slots=True)
class DisaggregatedTable:
    """Every split N_P = 1..N−1 of N workers, as arrays (index i ↔ N_P = i + 1)."""

    n_prefill: np.ndarray
    n_decode: np.ndarray
    prefill_s: np.ndarray  # compute part of T_prefill
    kv_transfer_s: np.ndarray  # transfer part of T_prefill
    decode_s: np.ndarray
    makespan_s: np.ndarray
    kv_ok: np.ndarray
    keepup_ok: np.ndarray

    @property
    def feasible(self) -> np.ndarray:
        both: np.ndarray = self.kv_ok & self.keepup_ok
        return both


def disaggregated_table(
    workload: WorkloadProfile,
    coeffs: EngineCoefficients,
    n: int,
    rule: FeasibilityRule = FeasibilityRule(),
) -> DisaggregatedTable:
    """Closed-form T_dis for every split of n workers at once (numpy)."""
    n_p = np.arange(1, max(n, 1), dtype=float)
    n_d = n - n_p
    p, kv, d = _disagg_arrays(workload, coeffs, n_p, n_d)
    kv, d = np.array(kv, dtype=float), np.asarray(d)  # d is an array for arrays of splits
    t_pre = p + kv
    makespan = (np.maximum(t_pre, d) + workload.env_time_s) * workload.scale_disaggregated
    kv_ok = n_d * coeffs.hbm_kv_capacity >= kv_need_bytes(workload, coeffs)
    keepup_ok = t_pre <= rule.prefill_keepup * d
    return DisaggregatedTable(n_p.astype(np.int64), n_d.astype(np.int64), p, kv, d, makespan, kv_ok, keepup_ok)


def predict_cross(
    workload: WorkloadProfile,
    prefill_coeffs: EngineCoefficients,
    decode_coeffs: EngineCoefficients,
    n_prefill: int,
    n_decode: int,
    link_bandwidth: float,
    rule: FeasibilityRule = FeasibilityRule(),
) -> Prediction:
    """Eq. 2–3 for a split whose prefill and decode pools are different chip types.

    Prefill compute from the prefill chip's t_prefill, decode from the decode chip's A + b·n, the KV hand-off
    over `link_bandwidth` per worker link (the link joining the two types), decode-KV feasibility against the
    decode chip's H_max. With both coefficient sets equal and the link the profile's own, this is
    `predict_disaggregated` exactly. The configuration carries no chip names (the caller labels it)."""
    config = Configuration.disaggregated(n_prefill, n_decode)
    p, kv, d = _disagg_arrays(
        workload,
        prefill_coeffs,
        np.asarray(float(n_prefill)),
        np.asarray(float(n_decode)),
        decode_coeffs,
        link_bandwidth,
    )
    prefill, kvs, decode = float(p), float(kv), float(d)
    makespan = (max(prefill + kvs, decode) + workload.env_time_s) * workload.scale_disaggregated
    why = _why(workload, decode_coeffs, n_decode, prefill + kvs, decode, rule)
    return Prediction(
        config, makespan, prefill, decode, kvs, workload.env_time_s, 0.0, not why, why, workload.scale_disaggregated
    )


def predict_colocated_spread(workload: WorkloadProfile, pools: list[tuple[EngineCoefficients, int]]) -> Prediction:
    """Eq. 1 for a homogeneous-minded policy on a mixed pool: every worker colocated, the batch spread evenly
    over all N workers (B/N trajectories each, whatever the chip); the slowest type sets the makespan.

    `pools` lists (coefficients, workers) per chip type. KV feasibility: each type holds its share."""
    w = workload
    n = sum(k for _, k in pools)
    config = Configuration.colocated(n)
    if n <= 0:
        return Prediction(config, float("inf"), 0.0, 0.0, 0.0, w.env_time_s, 0.0, False, "no workers")
    worst: tuple[float, float, float] = (-1.0, 0.0, 0.0)
    fits = True
    for coeffs, k in pools:
        if k <= 0:
            continue
        prefill = w.turns * w.batch_size * w.new_prompt_tokens / n * coeffs.t_prefill * coeffs.prefill_interference
        decode = w.turns * w.generated_tokens * float(coeffs.decode_iteration_s(w.batch_size / n))
        if prefill + decode > worst[0]:
            worst = (prefill + decode, prefill, decode)
        share = w.decode_kv_sequences * k / n
        fits = fits and share * w.kv_seq_tokens * coeffs.kv_bytes_per_token <= k * coeffs.hbm_kv_capacity
    overhead = w.turns * w.overhead_s
    makespan = (worst[0] + overhead + w.env_time_s) * w.scale_colocated
    why = "" if fits else "KV of a type's share of the batch exceeds its HBM"
    return Prediction(config, makespan, worst[1], worst[2], 0.0, w.env_time_s, overhead, fits, why, w.scale_colocated)


def predict_colocated_balanced(workload: WorkloadProfile, pools: list[tuple[EngineCoefficients, int]]) -> Prediction:
    """Eq. 1 on a mixed pool with the batch balanced across chip types: each type's workers take the share of
    the B trajectories that makes every type finish together (what join-the-shortest-queue dispatch tends
    to, and the best any all-colocated placement can do under Eq. 1). The share b_h per worker solves
    S·[b_h·ΔL·t_prefill_h·I_h + r·t_dec_h(b_h)] = T for a common T, found by bisection (t_dec increases in b)."""
    w = workload
    live = [(c, k) for c, k in pools if k > 0]
    n = sum(k for _, k in live)
    config = Configuration.colocated(n)
    if n <= 0:
        return Prediction(config, float("inf"), 0.0, 0.0, 0.0, w.env_time_s, 0.0, False, "no workers")

    def per_worker(c: EngineCoefficients, b: float) -> tuple[float, float]:
        pre = w.turns * b * w.new_prompt_tokens * c.t_prefill * c.prefill_interference
        return pre, w.turns * w.generated_tokens * float(c.decode_iteration_s(b))

    def share(c: EngineCoefficients, t: float) -> float:
        lo, hi = 0.0, float(w.batch_size)
        if sum(per_worker(c, hi)) <= t:
            return hi
        for _ in range(50):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if sum(per_worker(c, mid)) <= t else (lo, mid)
        return lo

    t_lo, t_hi = 0.0, max(sum(per_worker(c, w.batch_size / n)) for c, _ in live)
    for _ in range(50):
        t = 0.5 * (t_lo + t_hi)
        t_lo, t_hi = (t, t_hi) if sum(k * share(c, t) for c, k in live) < w.batch_size else (t_lo, t)
    shares = [share(c, t_hi) for c, _ in live]
    total = sum(k * b for (_, k), b in zip(live, shares, strict=True)) or 1.0
    norm = w.batch_size / total  # spend exactly B trajectories
    # a type whose share is zero runs nothing (its fixed per-iteration cost is not paid)
    parts = [per_worker(c, b * norm) for (c, _), b in zip(live, shares, strict=True) if b * norm > 1e-12]
    prefill, decode = max(parts, key=lambda pd: pd[0] + pd[1])
    fits = all(
        w.decode_kv_sequences * k * b * norm / w.batch_size * w.kv_seq_tokens * c.kv_bytes_per_token
        <= k * c.hbm_kv_capacity
        for (c, k), b in zip(live, shares, strict=True)
    )
    overhead = w.turns * w.overhead_s
    makespan = (prefill + decode + overhead + w.env_time_s) * w.scale_colocated
    why = "" if fits else "KV of a type's share of the batch exceeds its HBM"
    return Prediction(config, makespan, prefill, decode, 0.0, w.env_time_s, overhead, fits, why, w.scale_colocated)


# A colocated worker's share of the batch at which `serving_rates` compares chips: the paper's BS64 over its
# 8 rollout workers.
RATE_SHARE = 8.0


def serving_rates(workload: WorkloadProfile, coeffs: dict[str, EngineCoefficients]) -> dict[str, float]:
    """Each chip type's speed as a colocated worker, relative to the fastest (1.0): trajectory turns per second
    at `RATE_SHARE` trajectories, from Eq. 1's per-worker terms. The sticky router homes trajectories in
    proportion to it, so a mixed colocated pool runs as `predict_colocated_balanced` prices it (with every
    worker homed alike, the slowest chip held an even share and the step's tail)."""
    w, b = workload, RATE_SHARE

    def turns_per_s(c: EngineCoefficients) -> float:
        pre = b * w.new_prompt_tokens * c.t_prefill * c.prefill_interference
        return b / (pre + w.generated_tokens * float(c.decode_iteration_s(b)))

    speed = {h: turns_per_s(c) for h, c in coeffs.items()}
    top = max(speed.values(), default=1.0)
    return {h: v / top for h, v in speed.items()}


@lru_cache(maxsize=256)
def prior_serving_rates(model: str, hardware: tuple[str, ...], tp: int, max_trajectory_tokens: int) -> dict[str, float]:
    """`serving_rates` of a job's chip types from their profiles (the prior, the SWE-bench-like workload), keyed
    by the upper-cased name: what the simulator and the control plane both give the router, so a mixed pool is
    homed alike in both. The caller must not change the dict (it is cached)."""
    w = swe_bench_workload(64, max_trajectory_tokens)
    co = {
        h: get_profile(h, model, tp).coefficients(
            new_tokens=w.new_prompt_tokens, prefix=w.prefix_tokens, mean_context=w.mean_context
        )
        for h in {h.upper() for h in hardware}
    }
    return serving_rates(w, co)


def predict(
    workload: WorkloadProfile,
    coeffs: EngineCoefficients,
    config: Configuration,
    rule: FeasibilityRule = FeasibilityRule(),
) -> Prediction:
    if config.mode is Mode.COLOCATED:
        return predict_colocated(workload, coeffs, config.n_colocated)
    return predict_disaggregated(workload, coeffs, config.n_prefill, config.n_decode, rule)


__all__ = [
    "RATE_SHARE",
    "SWE_BENCH_PROMPT_TO_GENERATED",
    "DisaggregatedTable",
    "FeasibilityRule",
    "Prediction",
    "WorkloadProfile",
    "disaggregated_table",
    "kv_fits",
    "kv_need_bytes",
    "min_workers_for_kv",
    "predict",
    "predict_colocated",
    "predict_colocated_balanced",
    "predict_colocated_spread",
    "predict_cross",
    "predict_disaggregated",
    "prior_serving_rates",
    "serving_rates",
    "swe_bench_workload",
]
