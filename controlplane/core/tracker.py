"""Runtime Tracker (paper §2–3): refits the predictor's workload and engine coefficients online.

Telemetry is noisy (stragglers, preemption-interrupted iterations, GC pauses), and the workload
drifts step to step (no stationarity), so every estimate here is
  * recency-weighted: exponential weights by age, half-life `half_life` observations;
  * robust: weighted medians for scalars; Huber-IRLS for the regressions (A, b) and (t0, t_prefill);
  * guarded: a coefficient replaces the static profile only after `min_samples` observations, and
    carries a confidence in [0, 1] from its effective sample size and relative spread.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, replace

import numpy as np

from controlplane.core.borrowing import ToggleCostEstimator
from controlplane.core.predictor import WorkloadProfile, swe_bench_workload
from controlplane.core.profiles import EngineCoefficients, Profile
from controlplane.core.telemetry import RecordKind, TelemetryRecord

# The relative error of a makespan prediction, as a standard deviation, before a job has measured its own
# (`FittedProfile.makespan_error`): the predictor's step-start MAPE is 12-13% at constant resources and 10-13%
# elastic (benchmarks/BENCHMARKS.md, "The predictor"); a normal error's MAPE is 0.8 of its standard deviation.
MAKESPAN_ERROR = 0.16
ERROR_MIN_SAMPLES = 3  # steps a fitted workload predicted before the job's own error replaces MAKESPAN_ERROR
ERROR_MIN, ERROR_MAX = 0.05, 0.6  # bounds of a job's own makespan error
NORMAL_MAD = 0.6745  # a normal error's median absolute deviation, in standard deviations


def _weights(n: int, half_life: float) -> np.ndarray:
    """Exponential recency weights, newest last."""
    age = np.arange(n - 1, -1, -1, dtype=float)
    return 0.5 ** (age / max(half_life, 1e-9))


def weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    order = np.argsort(values)
    v, w = values[order], weights[order]
    c = np.cumsum(w)
    return float(v[np.searchsorted(c, 0.5 * c[-1])])


def huber_fit(
    x: np.ndarray, y: np.ndarray, w: np.ndarray, *, iters: int = 20, k: float = 1.345
) -> tuple[float, float, float]:
    """Weighted Huber regression y ≈ a + b·x by IRLS; returns (a, b, robust relative residual scale)."""
    ww = w.copy()
    a, b = 0.0, 0.0
    scale = 0.0
    for _ in range(iters):
        # weighted least squares of a line in closed form (centred normal equations): the same solution as
        # an SVD least-squares solve, at a fraction of its cost for two parameters (this runs at every decision)
        sw = float(ww.sum())
        xm, ym = float(ww @ x) / sw, float(ww @ y) / sw
        dx = x - xm
        sxx = float(ww @ (dx * dx))
        b_new = float(ww @ (dx * (y - ym))) / sxx if sxx > 0 else 0.0
        a_new = ym - b_new * xm
        r = y - (a_new + b_new * x)
        ar = np.abs(r)
        scale = 1.4826 * float(np.median(ar)) + 1e-12
        u = ar / (k * scale)
        ww = w * np.minimum(1.0, 1.0 / np.maximum(u, 1e-12))
        done = abs(a_new - a) <= 1e-15 + 1e-9 * abs(a) and abs(b_new - b) <= 1e-15 + 1e-9 * abs(b)
        a, b = a_new, b_new
        if done:
            break
    level = float(np.median(np.abs(y))) + 1e-12
    return a, b, scale / level


def _confidence(n_eff: float, rel_spread: float, full_at: float) -> float:
    """0..1: grows with the effective sample size, shrinks with relative spread."""
    size = n_eff / (n_eff + full_at / 3.0)
    return float(max(0.0, min(1.0, size / (1.0 + 2.0 * max(rel_spread, 0.0)))))


@dataclass(frozen=True, slots=True)
class Estimate:
    value: float
    confidence: float  # 0..1
    samples: int
    fitted: bool  # False: the static prior is in use


@dataclass(frozen=True, slots=True)
class FittedProfile:
    """What the predictor needs now, and how much to trust it."""

    workload: WorkloadProfile
    coefficients: EngineCoefficients
    estimates: dict[str, Estimate] = field(default_factory=dict)
    toggle_s: float = 0.0
    # the job's makespan error as a relative standard deviation: its own, from the median |ln(observed / predicted
    # at the step's start)| of the steps a fitted workload predicted, once it has ERROR_MIN_SAMPLES (before them
    # MAKESPAN_ERROR): a step's start forecast is what the arbiter's curve is, capacity changes in flight included
    makespan_error: float = MAKESPAN_ERROR

    def confidence(self, name: str) -> float:
        e = self.estimates.get(name)
        return e.confidence if e else 0.0

    @property
    def measured(self) -> bool:
        """The workload is fitted to the job's own steps (its turns and response lengths), not the prior."""
        return all((e := self.estimates.get(k)) is not None and e.fitted for k in ("S", "r"))


class _Series:
    """A bounded window of scalar observations with recency weights."""

    def __init__(self, window: int) -> None:
        self.values: deque[float] = deque(maxlen=window)
        self.total = 0
        # the last estimate and what it was computed from: a decision reads the same series many times
        # between two observations (every signal, every chip type), and an estimate is a pure function of them
        self._memo: tuple[tuple[int, float, float, int, float], Estimate] | None = None

    def add(self, v: float) -> None:
        v = float(v)
        if math.isfinite(v):
            self.values.append(v)
            self.total += 1

    def estimate(self, prior: float, half_life: float, min_samples: int, full_at: float) -> Estimate:
        key = (self.total, prior, half_life, min_samples, full_at)
        if self._memo is not None and self._memo[0] == key:
            return self._memo[1]
        est = self._estimate(prior, half_life, min_samples, full_at)
        self._memo = (key, est)
        return est

    def _estimate(self, prior: float, half_life: float, min_samples: int, full_at: float) -> Estimate:
        n = len(self.values)
        if n < min_samples:
            return Estimate(prior, 0.0, self.total, False)
        v = np.fromiter(self.values, dtype=float, count=n)
        w = _weights(n, half_life)
        med = weighted_median(v, w)
        mad = weighted_median(np.abs(v - med), w)
        n_eff = float(w.sum() ** 2 / (w**2).sum())
        rel = 1.4826 * mad / (abs(med) + 1e-12)
        return Estimate(med, _confidence(n_eff, rel, full_at), self.total, True)


class _Pairs:
    """A bounded window of (x, y) observations for a robust linear fit; a tagged observation's y
    can be rescaled at fit time (prefill next to decodes, brought to its cost alone)."""

    def __init__(self, window: int) -> None:
        self.x: deque[float] = deque(maxlen=window)
        self.y: deque[float] = deque(maxlen=window)
        self.tag: deque[bool] = deque(maxlen=window)
        self.total = 0
        # the last fit and its inputs (`_Series`'s memo): the IRLS is refitted only after a new observation
        self._memo: tuple[tuple[int, float, int, float], tuple[float, float, float, float] | None] | None = None

    def add(self, x: float, y: float, tag: bool = False) -> None:
        x, y = float(x), float(y)
        if math.isfinite(x) and math.isfinite(y) and y > 0:  # math, not numpy: one call per engine record
            self.x.append(x)
            self.y.append(y)
            self.tag.append(tag)
            self.total += 1

    def fit(
        self, half_life: float, min_samples: int, tagged_scale: float = 1.0
    ) -> tuple[float, float, float, float] | None:
        """(intercept, slope, confidence, n) or None when too few points or no spread in x."""
        key = (self.total, half_life, min_samples, tagged_scale)
        if self._memo is not None and self._memo[0] == key:
            return self._memo[1]
        out = self._fit(half_life, min_samples, tagged_scale)
        self._memo = (key, out)
        return out

    def _fit(self, half_life: float, min_samples: int, tagged_scale: float) -> tuple[float, float, float, float] | None:
        n = len(self.x)
        if n < min_samples:
            return None
        x = np.fromiter(self.x, dtype=float, count=n)
        y = np.fromiter(self.y, dtype=float, count=n)
        if tagged_scale != 1.0:
            y = np.where(np.fromiter(self.tag, dtype=bool, count=n), y * tagged_scale, y)
        if np.ptp(x) <= 0:
            return None
        w = _weights(n, half_life)
        a, b, rel = huber_fit(x, y, w)
        n_eff = float(w.sum() ** 2 / (w**2).sum())
        spread = min(1.0, np.ptp(x) / (abs(np.median(x)) + 1e-12))  # identifiability of the slope
        conf = _confidence(n_eff, rel, 60.0) * (0.5 + 0.5 * spread)
        return a, b, conf, n


SCALE_MIN, SCALE_MAX = 0.5, 2.0  # bounds of the online makespan correction
INTERFERENCE_MIN, INTERFERENCE_MAX = 0.5, 4.0  # bounds of the measured prefill interference I
SCALE_MIN_SAMPLES = 1  # bounded, so one step of a fitted workload is enough to start correcting


class RuntimeTracker:
    """Ingests TelemetryRecords and serves the current fitted workload + engine coefficients."""

    def __init__(
        self,
        profile: Profile,
        workload_prior: WorkloadProfile | None = None,
        *,
        batch_size: int | None = None,
        half_life: float = 4.0,  # steps for step-level figures
        iteration_half_life: float = 200.0,  # engine samples (iterations / prefill passes)
        min_steps: int = 2,
        min_engine_samples: int = 20,
        window: int = 64,
        engine_window: int = 2048,
        max_trajectory_tokens: int | None = None,
    ) -> None:
        self.profile = profile
        # The job's trajectory length cap: no trajectory's KV outgrows it, whatever S·(ΔL + r) says.
        self.max_trajectory_tokens = (
            max_trajectory_tokens if max_trajectory_tokens and max_trajectory_tokens > 0 else None
        )
        self.prior = workload_prior or swe_bench_workload(batch_size or 64, self.max_trajectory_tokens or 32768)
        if batch_size is not None and batch_size != self.prior.batch_size:
            self.prior = replace(self.prior, batch_size=batch_size)
        self.half_life = half_life
        self.iteration_half_life = iteration_half_life
        self.min_steps = min_steps
        self.min_engine_samples = min_engine_samples
        self._turns = _Series(window)
        self._dl = _Series(window)
        # ΔL as measured under each mode (prompt tokens engines prefilled per turn): disaggregation
        # re-prefills the previous response on the prefill worker, colocation serves it from cache
        self._dl_mode = {"colocated": _Series(window), "disaggregated": _Series(window)}
        self._r = _Series(window)
        self._env = _Series(window)
        self._f = _Series(window)
        self._batch = _Series(window)
        self._peak = _Series(window)
        # observed / raw-predicted makespan per mode (see WorkloadProfile.scale_*), and both modes pooled
        self._scale = {"colocated": _Series(window), "disaggregated": _Series(window)}
        self._scale_all = _Series(window)
        self._error = _Series(window)  # |ln(observed / step-start predicted makespan)|, fitted workloads' steps
        self._decode = _Pairs(engine_window)
        self._prefill = _Pairs(engine_window)  # tagged: the prefill ran next to decodes (colocated)
        # prefill time / the profile's roofline prefill time, alone and next to decodes: their ratio is
        # the PD interference I (the roofline normalises the prompt and prefix sizes, which differ
        # between the two kinds of pass; its own error cancels in the ratio)
        self._prefill_rel = {False: _Series(engine_window), True: _Series(engine_window)}
        self._bw = _Series(engine_window)
        self.toggle = ToggleCostEstimator(profile.reconfig)
        # per-step aggregation of TURN records (used when no STEP record summarises the step)
        self._turn_steps: dict[tuple[str, int], dict[str, dict[str, float]]] = {}
        self._stepped: set[tuple[str, int]] = set()
        self.records = 0
        self._cache: tuple[int, FittedProfile] | None = None  # fitted() memo, valid while no new record

    # -- ingestion ----------------------------------------------------------------------------
    def observe(self, record: TelemetryRecord) -> None:
        self.records += 1
        k = record.kind
        if k is RecordKind.STEP:
            self._observe_step(record)
        elif k is RecordKind.TURN:
            self._observe_turn(record)
        elif k is RecordKind.DECODE_ITERATION:
            if record.running_batch > 0 and record.duration_s > 0:
                self._decode.add(record.running_batch, record.duration_s)
        elif k is RecordKind.PREFILL:
            if record.tokens > 0 and record.duration_s > 0:
                mixed = record.running_batch > 0
                self._prefill.add(record.tokens, record.duration_s, mixed)
                roofline = self.profile.prefill_s(record.tokens, record.prefix_tokens)
                if roofline > 0:
                    self._prefill_rel[mixed].add(record.duration_s / roofline)
        elif k is RecordKind.KV_TRANSFER:
            if record.kv_bytes > 0 and record.duration_s > 0:
                self._bw.add(record.kv_bytes / record.duration_s)
        elif k is RecordKind.TOGGLE:
            a = record.activation_s
            r = record.return_s
            if a > 0 or r > 0:
                self.toggle.observe(a, r)
            elif record.duration_s > 0:
                self.toggle.observe(record.duration_s, 0.0)

    def _observe_step(self, rec: TelemetryRecord) -> None:
        # Whether the prediction this step was judged by came from a fitted workload (not the prior):
        # only then is observed/predicted the model's error rather than the prior's.
        workload_was_fitted = len(self._turns.values) >= self.min_steps and len(self._r.values) >= self.min_steps
        key = (rec.job, rec.step)
        self._stepped.add(key)
        self._turn_steps.pop(key, None)
        if rec.batch_size > 0:
            self._batch.add(rec.batch_size)
        if rec.turns_max > 0:
            self._turns.add(rec.turns_max)
        if rec.new_prompt_tokens_mean > 0:
            self._dl.add(rec.new_prompt_tokens_mean)
            if rec.mode in self._dl_mode:
                self._dl_mode[rec.mode].add(rec.new_prompt_tokens_mean)
        if rec.generated_tokens_mean > 0:
            self._r.add(rec.generated_tokens_mean)
        if rec.env_time_total_s > 0:
            self._env.add(rec.env_time_total_s)
        if 0.0 < rec.active_decode_fraction <= 1.0:
            self._f.add(rec.active_decode_fraction)
        if not (workload_was_fitted and rec.makespan_s > 0):
            return
        if rec.predicted_at_start_s > 0:
            self._error.add(abs(math.log(rec.makespan_s / rec.predicted_at_start_s)))
        if rec.predicted_makespan_s > 0 and rec.mode in self._scale:
            # The prediction already carried the correction in force (corrections only change at STEP
            # records), so the raw closed form predicted predicted/scale: the new sample is
            # scale·observed/predicted. Bounded: one wild step cannot swing the model.
            used = self._scales()[rec.mode]
            sample = min(max(used * rec.makespan_s / rec.predicted_makespan_s, SCALE_MIN), SCALE_MAX)
            self._scale[rec.mode].add(sample)
            self._scale_all.add(sample)

    def _observe_turn(self, rec: TelemetryRecord) -> None:
        key = (rec.job, rec.step)
        if key in self._stepped:
            return
        # a new step for this job closes the previous ones
        for old in [k for k in self._turn_steps if k[0] == rec.job and k[1] < rec.step]:
            self._close_turn_step(old)
        agg = self._turn_steps.setdefault(key, {})
        t = agg.setdefault(rec.trajectory or "?", {"turns": 0.0, "env": 0.0, "dl": 0.0, "r": 0.0})
        t["turns"] = max(t["turns"], rec.turn + 1.0)
        t["env"] += rec.env_time_s
        t["dl"] += rec.new_prompt_tokens
        t["r"] += rec.generated_tokens

    def _close_turn_step(self, key: tuple[str, int]) -> None:
        agg = self._turn_steps.pop(key, None)
        if not agg:
            return
        trajs = list(agg.values())
        turns = sum(t["turns"] for t in trajs)
        slowest = max(trajs, key=lambda t: (t["turns"], t["env"]))
        self._turns.add(slowest["turns"])
        self._env.add(slowest["env"])
        if turns > 0:
            self._dl.add(sum(t["dl"] for t in trajs) / turns)
            self._r.add(sum(t["r"] for t in trajs) / turns)

    def end_step(self, job: str = "", step: int | None = None) -> None:
        """Close TURN-only aggregation for a step (the driver calls this when no STEP record is sent)."""
        for k in [k for k in self._turn_steps if k[0] == job and (step is None or k[1] == step)]:
            self._close_turn_step(k)
        self._cache = None

    # -- outputs ------------------------------------------------------------------------------
    def mode_tried(self, mode: str) -> bool:
        """Whether a step in `mode` has been scored against its prediction (its correction is measured)."""
        series = self._scale.get(str(mode))
        return series is not None and len(series.values) > 0

    def _scales(self) -> dict[str, float]:
        """Per-mode makespan correction; a mode never run yet borrows the pooled figure (else 1).

        (A conservative prior max(pooled, 1) was tried for the untried mode and removed: against a running
        mode corrected to < 1 it handicaps the other mode by the whole correction, which locked PEARL into
        whichever mode the unfitted prior picked first — −2.8% vs RLBoost+ on paper-qwen3-30b-a3b-seg1. The
        safeguard for a never-run mode is the bounded trial in `PearlPolicy`.)"""
        hl = self.half_life
        pooled = self._scale_all.estimate(1.0, hl, SCALE_MIN_SAMPLES, 8)
        out = {}
        for mode, series in self._scale.items():
            est = series.estimate(pooled.value, hl, SCALE_MIN_SAMPLES, 8)
            out[mode] = min(max(est.value, SCALE_MIN), SCALE_MAX)
        return out

    def _delta_l_per_mode(self, dl: float, r: float) -> tuple[float, float | None]:
        """(ΔL colocated, ΔL disaggregated or None) from the steps measured in each mode.

        A prefill worker re-prefills the previous response every turn, a colocated worker serves it
        from its prefix cache: ΔL_dis ≈ ΔL_coloc + r. The mode never run is derived from the other;
        with no per-mode data (TURN-only telemetry) both are the pooled ΔL, as before."""
        hl, ms = self.half_life, self.min_steps
        col = self._dl_mode["colocated"].estimate(dl, hl, ms, 8)
        dis = self._dl_mode["disaggregated"].estimate(dl, hl, ms, 8)
        if col.fitted and dis.fitted:
            return col.value, dis.value
        if col.fitted:
            return col.value, col.value + r
        if dis.fitted:
            return max(dis.value - r, 0.1 * dis.value), dis.value
        return dl, None

    def workload(self) -> tuple[WorkloadProfile, dict[str, Estimate]]:
        p = self.prior
        hl, ms = self.half_life, self.min_steps
        est = {
            "S": self._turns.estimate(p.turns, hl, ms, 8),
            "delta_L": self._dl.estimate(p.new_prompt_tokens, hl, ms, 8),
            "r": self._r.estimate(p.generated_tokens, hl, ms, 8),
            "T_env": self._env.estimate(p.env_time_s, hl, ms, 8),
            "f": self._f.estimate(p.f, hl, ms, 8),
        }
        b = self._batch.estimate(p.batch_size, hl, 1, 4)
        if est["f"].fitted:
            f = min(max(est["f"].value, 1e-3), 1.0)
            theta = (1.0 - f) / f
        else:
            theta = p.theta
        est["theta"] = Estimate(theta, est["f"].confidence, est["f"].samples, est["f"].fitted)
        turns, dl, r = est["S"].value, est["delta_L"].value, est["r"].value
        dl_dis: float | None = None
        if est["delta_L"].fitted:
            dl, dl_dis = self._delta_l_per_mode(dl, r)
            est["delta_L_colocated"] = Estimate(dl, est["delta_L"].confidence, est["delta_L"].samples, True)
            if dl_dis is not None:
                est["delta_L_disaggregated"] = Estimate(dl_dis, est["delta_L"].confidence, est["delta_L"].samples, True)
        peak, ctx, pre = p.kv_seq_tokens, p.mean_context, p.prefix_tokens
        if est["S"].fitted or est["delta_L"].fitted or est["r"].fitted:
            # keep the prior's initial prompt and its context-to-peak ratios; regrow the per-turn part
            prompt = max(p.kv_seq_tokens - p.turns * (p.new_prompt_tokens + p.generated_tokens), 0.0)
            peak = prompt + turns * (dl + r)
            ctx = peak * (p.mean_context / p.kv_seq_tokens if p.kv_seq_tokens > 0 else 0.5)
            pre = peak * (p.prefix_tokens / p.kv_seq_tokens if p.kv_seq_tokens > 0 else 0.5)
        cap = self.max_trajectory_tokens
        if cap and peak > cap:  # length-capped trajectories: K_seq and the contexts scaled from it stop there
            k = cap / peak
            peak, ctx, pre = float(cap), ctx * k, pre * k
        pooled = self._scale_all.estimate(1.0, hl, SCALE_MIN_SAMPLES, 8)
        for mode, series in self._scale.items():
            est[f"scale_{mode}"] = series.estimate(pooled.value, hl, SCALE_MIN_SAMPLES, 8)
        scales = self._scales()
        w = replace(
            p,
            batch_size=int(round(b.value)),
            turns=turns,
            new_prompt_tokens=dl,
            generated_tokens=r,
            env_time_s=est["T_env"].value,
            theta=theta,
            kv_seq_tokens=peak,
            mean_context=ctx,
            prefix_tokens=pre,
            scale_colocated=scales["colocated"],
            scale_disaggregated=scales["disaggregated"],
            new_prompt_tokens_disaggregated=dl_dis,
            # T_over (colocated P/D switching per turn) is at most a user's prior guess (the shipped prior
            # has none): no telemetry measures it and the simulator has no such cost, so once the workload
            # is fitted the per-mode correction (observed / predicted makespan) carries whatever per-turn
            # overhead really exists
            overhead_s=0.0 if est["S"].fitted else p.overhead_s,
            # the expected, not worst-case, decode concurrency once f is measured
            kv_concurrency=b.value * (1.0 / (1.0 + theta)) if est["f"].fitted else p.kv_concurrency,
        )
        return w, est

    def coefficients(self, workload: WorkloadProfile | None = None) -> tuple[EngineCoefficients, dict[str, Estimate]]:
        w = workload or self.workload()[0]
        prior = self.profile.coefficients(
            new_tokens=w.new_prompt_tokens, prefix=w.prefix_tokens, mean_context=w.mean_context
        )
        est: dict[str, Estimate] = {}
        coeffs = prior
        dec = self._decode.fit(self.iteration_half_life, self.min_engine_samples)
        if dec is not None and dec[1] >= 0 and dec[0] > 0:
            a, b, conf, _n = dec
            # MoE: the fit is a local linearisation over the observed batches; drop the expert term
            coeffs = replace(coeffs, decode_a=a, decode_b=b, decode_a_moe=0.0, moe_experts=0, moe_topk=0)
            est["A"] = Estimate(a, conf, self._decode.total, True)
            est["b"] = Estimate(b, conf, self._decode.total, True)
        else:
            est["A"] = Estimate(prior.decode_a, 0.0, self._decode.total, False)
            est["b"] = Estimate(prior.decode_b, 0.0, self._decode.total, False)
        interference = self.interference()
        est["I"] = interference
        pre = self._prefill.fit(self.iteration_half_life, self.min_engine_samples, 1.0 / interference.value)
        if pre is not None and pre[1] > 0:
            t0, tp, conf, _n = pre
            # per-token cost (alone) at the workload's turn size, including the fixed pass overhead
            per_token = tp + max(t0, 0.0) / max(w.new_prompt_tokens, 1.0)
            coeffs = replace(coeffs, t_prefill=per_token)
            est["t_prefill"] = Estimate(per_token, conf, self._prefill.total, True)
        else:
            est["t_prefill"] = Estimate(prior.t_prefill, 0.0, self._prefill.total, False)
        coeffs = replace(coeffs, prefill_interference=interference.value)
        bw = self._bw.estimate(prior.bandwidth, self.iteration_half_life, self.min_engine_samples, 60.0)
        if bw.fitted:
            coeffs = replace(coeffs, bandwidth=bw.value)
        est["BW"] = bw
        return coeffs, est

    def interference(self) -> Estimate:
        """I: prefill next to running decodes over prefill alone, each against the roofline (1 until
        both kinds of pass have been seen, e.g. under disaggregation or a torch engine, which never
        mixes them). What the closed forms cannot otherwise tell apart: a colocated correction > 1
        from interference would be borrowed by a disaggregated split that has none."""
        hl, ms = self.iteration_half_life, self.min_engine_samples
        alone = self._prefill_rel[False].estimate(1.0, hl, ms, 60.0)
        mixed = self._prefill_rel[True].estimate(1.0, hl, ms, 60.0)
        if not (alone.fitted and mixed.fitted) or alone.value <= 0:
            return Estimate(1.0, 0.0, min(alone.samples, mixed.samples), False)
        value = min(max(mixed.value / alone.value, INTERFERENCE_MIN), INTERFERENCE_MAX)
        return Estimate(value, min(alone.confidence, mixed.confidence), min(alone.samples, mixed.samples), True)

    def makespan_error(self) -> float:
        """The job's own makespan error (relative standard deviation), MAKESPAN_ERROR until it has measured one:
        a step bounded by its slowest trajectory's heavy-tailed tool calls is predicted far worse than the mean
        (the draw 2jobs-s103's big job: 30-50% off from step to step), and the cluster arbiter weighs a rollout
        against its trainer over this error (`policies.base.best_step_time`)."""
        est = self._error.estimate(MAKESPAN_ERROR * NORMAL_MAD, self.half_life, ERROR_MIN_SAMPLES, 8)
        if not est.fitted:
            return MAKESPAN_ERROR
        return min(max(est.value / NORMAL_MAD, ERROR_MIN), ERROR_MAX)

    def fitted(self) -> FittedProfile:
        """Current workload + engine coefficients for the predictor (memoised until the next record)."""
        if self._cache is not None and self._cache[0] == self.records:
            return self._cache[1]
        w, west = self.workload()
        c, cest = self.coefficients(w)
        fp = FittedProfile(w, c, {**west, **cest}, self.toggle.value, self.makespan_error())
        self._cache = (self.records, fp)
        return fp


class HardwareTrackers:
    """Runtime tracking on a mixed pool: the workload is the job's (one fit over every record), the engine
    coefficients are each chip type's (one RuntimeTracker per type, fed only the engine records of that
    type's workers, so a type's prior is corrected by its own telemetry only).

    Telemetry records do not name their worker's hardware, so the caller passes it with each record
    (None: a record that is not about one worker, e.g. a STEP summary)."""

    def __init__(
        self,
        profiles: dict[str, Profile],
        workload_prior: WorkloadProfile | None = None,
        *,
        batch_size: int | None = None,
        max_trajectory_tokens: int | None = None,
        pooled: RuntimeTracker | None = None,
    ) -> None:
        if not profiles and pooled is None:
            raise ValueError("a mixed pool needs at least one hardware profile")
        first = next(iter(profiles.values())) if profiles else None
        self._prior = workload_prior
        self._kw = {"batch_size": batch_size, "max_trajectory_tokens": max_trajectory_tokens}
        # `pooled`: share the job's own tracker (a policy's) instead of fitting the workload twice
        self.pooled = pooled or RuntimeTracker(first, workload_prior, **self._kw)  # type: ignore[arg-type]
        self.by_type = {h: RuntimeTracker(p, workload_prior, **self._kw) for h, p in profiles.items()}  # type: ignore[arg-type]

    def add(self, hardware: str, profile: Profile) -> RuntimeTracker:
        """Track one more chip type, from its prior (a type that joins the pool later)."""
        if hardware not in self.by_type:
            self.by_type[hardware] = RuntimeTracker(profile, self._prior, **self._kw)  # type: ignore[arg-type]
        return self.by_type[hardware]

    def observe(self, record: TelemetryRecord, hardware: str | None = None) -> None:
        self.pooled.observe(record)
        if hardware is not None:
            if hardware not in self.by_type:
                raise ValueError(f"no profile for hardware {hardware!r}; known: {sorted(self.by_type)}")
            self.by_type[hardware].observe(record)

    def fitted(self) -> tuple[WorkloadProfile, dict[str, EngineCoefficients]]:
        """The job's workload and, per chip type, its coefficients at that workload (the prior until that
        type's own engine telemetry passes the tracker's sample minimum)."""
        w = self.pooled.fitted().workload
        return w, {h: t.coefficients(w)[0] for h, t in self.by_type.items()}


__all__ = ["Estimate", "FittedProfile", "HardwareTrackers", "RuntimeTracker", "huber_fit", "weighted_median"]
