"""PEARL's policy (the paper): the PD-adaptive decision on every signal and gated borrowing."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, ClassVar

from controlplane.core.borrowing import GateResult, gate
from controlplane.core.context import PolicyContext, Signal
from controlplane.core.decision import Candidate, Thresholds, decide, decide_mixed, evaluate_mixed, single_type
from controlplane.core.policies import names
from controlplane.core.policies.base import OptionSpec, PolicyAction, TrackedPolicy, best_makespan, with_inputs
from controlplane.core.predictor import WorkloadProfile
from controlplane.core.profiles import EngineCoefficients, get_hardware, get_profile, link_bytes_per_s
from controlplane.core.state import Configuration, Mode
from controlplane.core.telemetry import TelemetryRecord
from controlplane.core.tracker import FittedProfile, HardwareTrackers

_TH = Thresholds()  # the default hysteresis thresholds


class PearlPolicy(TrackedPolicy):
    """The paper: PD-adaptive decision on every signal + gated borrowing of overlap workers.

    `gate=False` borrows every idle overlap worker without Eq. 7 (the ablation's component B
    without C, paper Fig. 7); the decision engine and tracker are unchanged.
    """

    name = names.PEARL
    color = "#d62728"
    summary = "PEARL: PD mode and P:D ratio from the online makespan predictor, gated borrowing, elasticity"
    options: ClassVar[tuple[OptionSpec, ...]] = (
        OptionSpec("gate", bool, True, "apply the Eq. 7 borrowing gate (false: borrow every idle window; ablation)"),
        OptionSpec(
            "ratio_change",
            float,
            _TH.ratio_change,
            "hysteresis: minimum predicted gain to change the P:D ratio",
            0.0,
            1.0,
        ),
        OptionSpec(
            "mode_switch",
            float,
            _TH.mode_switch,
            "hysteresis: minimum predicted gain to switch colocated <-> disaggregated",
            0.0,
            1.0,
        ),
        OptionSpec(
            "mode_trial",
            bool,
            True,
            "start colocated and enter a mode never run yet only as a one-step trial at a step start, once "
            "the workload is fitted (false: follow the closed form from the first decision)",
        ),
    )

    def __init__(
        self,
        *,
        gate: bool = True,
        ratio_change: float = _TH.ratio_change,
        mode_switch: float = _TH.mode_switch,
        mode_trial: bool = True,
        **kw: Any,
    ) -> None:
        super().__init__(**kw)
        self.gated = gate
        self.thresholds = Thresholds(ratio_change, mode_switch)
        self.mode_trial = mode_trial
        # mixed pools (issue 23): one tracker per chip type, sharing the job's workload fit
        self.hw_trackers: HardwareTrackers | None = None
        self._worker_hw: dict[int, str] = {}
        self._kinds_run: set[str] = set()  # configuration kinds (mode, prefill chip, decode chip) that have run
        # the borrow window as last seen: when the trainer began (Training Begin), how long it took to Training
        # Finished, and the overlap workers then lent (chip, count); a step start prices kinds over it
        self._tb_s: float | None = None
        self._window: tuple[float, str, int] | None = None

    # a mixed decision chooses only among candidates on one chip type (the best-homogeneous baseline)
    single_type_only: ClassVar[bool] = False

    @property
    def allow(self) -> Callable[[Candidate], bool] | None:
        """The candidates a mixed decision may choose from (None: all)."""
        return single_type if self.single_type_only else None

    def observe(self, record: TelemetryRecord) -> None:
        # the worker's chip: the pool's map (the control plane's record of the worker) first, else the record's own
        # field, which also places records of workers no longer in the pool and those a live planner replays
        # before its first decision (it rebuilds the policy from stored telemetry at every signal)
        wid = record.worker
        hw = (self._worker_hw.get(wid, "") if isinstance(wid, int) else "") or _chip(record.hardware)
        if self.hw_trackers is None and not hw:
            super().observe(record)
            return
        trackers = self._trackers()
        if hw and hw not in trackers.by_type:
            try:
                trackers.add(hw, get_profile(hw, self.profile.model, self.profile.tp))
            except ValueError:
                hw = ""  # a chip with no profile: its records still feed the job's workload fit
        trackers.observe(record, hw or None)

    def _trackers(self) -> HardwareTrackers:
        if self.hw_trackers is None:
            self.hw_trackers = HardwareTrackers({}, batch_size=self.batch_size, pooled=self.tracker)
        return self.hw_trackers

    def state(self) -> dict[str, Any]:
        out = super().state()
        if self._kinds_run:
            out["kinds_run"] = sorted(self._kinds_run)
        if self._tb_s is not None:
            out["training_begin_s"] = self._tb_s
        if self._window is not None:
            out["borrow_window"] = list(self._window)
        return out

    def load_state(self, state: Mapping[str, Any]) -> None:
        super().load_state(state)
        self._kinds_run = set(state.get("kinds_run") or ())
        tb = state.get("training_begin_s")
        self._tb_s = float(tb) if isinstance(tb, (int, float)) else None
        win = state.get("borrow_window")
        if isinstance(win, (list, tuple)) and len(win) == 3:
            self._window = (float(win[0]), str(win[1]), int(win[2]))

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
        return (
            self.mode_trial
            and budget > 0
            and (cur is None or cur.total <= 0)
            and not ov.force_mode
            and ov.force_ratio is None
            and not self.tracker.mode_tried("colocated")
            and not self.tracker.mode_tried("disaggregated")
        )

    def on_event(self, ctx: PolicyContext) -> PolicyAction:
        if ctx.mixed:
            return self._on_event_mixed(ctx)
        w, c, fp = self.fitted(ctx)
        dedicated = self._dedicated(ctx)
        ov = ctx.overrides
        thresholds, trial_note = self._thresholds(ctx, fp)
        borrow, g = 0, None
        if _may_borrow(ctx):
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
            d = replace(
                d,
                reason=f"First configuration: {d.configuration.label()} ({d.predicted_makespan_s:.1f} s). "
                f"No mode has run yet, so PEARL starts in the baseline's mode (colocated){rated}; "
                f"disaggregation is tried only for one step, at a fitted step start.",
            )
        d = with_inputs(
            d,
            signal=str(ctx.signal),
            dedicated=dedicated,
            borrow=borrow,
            gate=_gate_note(g, ctx),
            confidence={k: round(e.confidence, 3) for k, e in fp.estimates.items()},
            toggle_s=fp.toggle_s,
        )
        if trial_note:
            d = with_inputs(d, mode_trial=trial_note)
        d = replace(d, gate=g)
        return self._act(d.configuration, borrow, d)

    def _gate(
        self, w: WorkloadProfile, c: EngineCoefficients, ctx: PolicyContext, n_ded: int, n_full: int
    ) -> GateResult:
        return self._gate_times(ctx, w, best_makespan(w, c, n_ded), best_makespan(w, c, n_full))

    # ------------------------------------------------------------------------------------ mixed pools
    def _type_coefficients(self, ctx: PolicyContext, w: WorkloadProfile) -> dict[str, EngineCoefficients]:
        """Each chip type's coefficients at the job's fitted workload: its prior (the chip's roofline)
        corrected by that type's own engine telemetry (`HardwareTrackers`); a type never seen is its prior."""
        trackers = self._trackers()
        types = {h for h, _ in ctx.hardware} | ({ctx.overlap_hardware} if ctx.overlap_hardware else set())
        for h in types:
            trackers.add(h, get_profile(h, self.profile.model, self.profile.tp))
        return {h: trackers.by_type[h].coefficients(w)[0] for h in types}

    def _link(self) -> Callable[[str, str], float]:
        tp = self.profile.tp
        return lambda a, b: link_bytes_per_s(a, b, tp)

    def _mixed_best(
        self,
        w: WorkloadProfile,
        co: Mapping[str, EngineCoefficients],
        pool: Mapping[str, int],
        allow: Callable[[Candidate], bool] | None,
    ) -> float:
        if sum(pool.values()) <= 0:
            return math.inf
        d = decide_mixed(w, co, pool, self._link(), allow=allow)
        return d.predicted_makespan_s

    def _on_event_mixed(self, ctx: PolicyContext) -> PolicyAction:
        """The decision over a mixed pool: colocated per type, disaggregated within a type, cross-type splits
        (`decide_mixed`), with the same hysteresis, the borrowing gate over the mixed best makespans and the
        bounded-trial safeguard per configuration kind (a kind never run is entered only as a one-step trial
        at a fitted step start; the first configuration is the baselines': every worker colocated)."""
        self._worker_hw = dict(ctx.worker_hardware)
        w, _, fp = self.fitted(ctx)
        co = self._type_coefficients(ctx, w)
        ded = {h: n for h, n in ctx.hardware if n > 0}
        if not ctx.overrides.elasticity:
            ded = dict(ded)  # the pool's reserved share is not typed in the context: keep every dedicated type
        ov = ctx.overrides
        cur = ctx.current
        if cur is not None and cur.total > 0:
            self._kinds_run.add(_kind(cur))
        oh = ctx.overlap_hardware
        if ctx.signal is Signal.TRAINING_BEGIN:
            self._tb_s = ctx.now_s
        elif ctx.signal is Signal.TRAINING_FINISHED and self._tb_s is not None and oh and ctx.overlap_workers > 0:
            self._window = (max(0.0, ctx.now_s - self._tb_s), oh, ctx.overlap_workers)

        def with_borrow(k: int) -> dict[str, int]:
            pool = dict(ded)
            if k > 0 and oh:
                pool[oh] = pool.get(oh, 0) + k
            return pool

        # Mid-step a switch of kind (mode or chip types of a role) re-roles workers whose in-flight trajectories
        # then lose their prefix caches and drain, and the pool that made it look better changes back at the next
        # Training Begin / Finished; at a step start the new batch has no cache to lose. So within a step only the
        # membership changes (workers join or leave the running kind: borrowed ones too); a switch of kind waits
        # for the next step start. Forced switches (no candidate of the kind) bypass this.
        mid_step = (
            self.mode_trial
            and cur is not None
            and cur.total > 0
            and ctx.signal is not Signal.STEP_START
            and not ov.force_mode
            and not ov.force_configuration
        )
        base_allow = self.allow
        if mid_step and cur is not None:
            keep, present = cur, {h for h, n in ctx.hardware if n > 0} | ({oh} if oh else set())
            allow_now: Callable[[Candidate], bool] | None = lambda c: (
                _same_kind(c.configuration, keep)
                and _keeps_running(c.configuration, keep, present)
                and (base_allow is None or base_allow(c))
            )
        else:
            allow_now = base_allow
        borrow, g = 0, None
        if _may_borrow(ctx):
            t_full = self._mixed_best(w, co, with_borrow(ctx.overlap_workers), allow_now)
            have = min(ctx.borrowed, ctx.overlap_workers)
            if have > 0:
                borrow = have
                if ctx.overlap_workers > have:
                    g = self._gate_times(ctx, w, self._mixed_best(w, co, with_borrow(have), allow_now), t_full)
                    borrow = ctx.overlap_workers if g.admit else have
            else:
                g = self._gate_times(ctx, w, self._mixed_best(w, co, ded, allow_now), t_full)
                borrow = ctx.overlap_workers if g.admit else 0
        pool = with_borrow(borrow)
        budget = sum(pool.values())
        inputs: dict[str, Any] = {
            "signal": str(ctx.signal),
            "pool": pool,
            "borrow": borrow,
            "gate": _gate_note(g, ctx),
            "confidence": {k: round(e.confidence, 3) for k, e in fp.estimates.items()},
            "toggle_s": fp.toggle_s,
        }
        if ov.force_configuration:
            cfg = Configuration.parse(ov.force_configuration)
            md = decide_mixed(
                w,
                co,
                pool,
                self._link(),
                current=cfg,
                thresholds=Thresholds(math.inf, math.inf),
            )
            d = replace(md, configuration=cfg, reason=f"Override: {cfg.label()}.").as_decision(budget, inputs, True)
            return self._act(cfg, borrow, replace(d, gate=g))
        allow = self.allow
        if ov.force_mode:
            forced = Mode(ov.force_mode)
            base = allow
            allow = (lambda c: c.mode is forced and (base is None or base(c))) if base else (lambda c: c.mode is forced)
        th, note = self.thresholds, ""
        current = cur if cur is not None and cur.total > 0 else None
        if self.mode_trial and not ov.force_mode:
            if current is None and not self._kinds_run:
                # the baselines' configuration: every worker colocated (over every type, balanced)
                types = sorted(h for h, n in pool.items() if n > 0)
                if types and (
                    allow is None
                    or allow(Candidate.of(Configuration.colocated(budget, "+".join(types)), 0, True, 0, 0, 0, 0))
                ):
                    current = Configuration.colocated(budget, "+".join(types))
                th, note = Thresholds(th.ratio_change, math.inf), "no configuration run yet: starting colocated"
            elif mid_step:
                allow = allow_now
                note = "within a step only membership changes; a switch of kind waits for a step start"
            else:
                fitted = all(fp.estimates[k].fitted for k in ("S", "r", "delta_L") if k in fp.estimates)
                if not fitted:
                    base = allow
                    run = set(self._kinds_run) | ({_kind(current)} if current is not None else set())
                    allow = lambda c: _kind(c.configuration) in run and (base is None or base(c))
                    note = "kinds never run are entered only as a one-step trial at a fitted step start"
                else:
                    note = "a kind never run may be entered now, as a one-step trial"
        if ctx.signal is Signal.STEP_START and self.mode_trial and not ov.force_mode and not ov.freeze:
            step_allow, why = self._step_kind(ctx, w, co, pool, allow, current, th)
            if step_allow is not None:
                allow = step_allow
                inputs["step_kind"] = why
        if ov.freeze and current is not None:
            th = Thresholds(math.inf, math.inf)
        md = decide_mixed(
            w,
            co,
            pool,
            self._link(),
            current=current,
            thresholds=th,
            allow=allow,
        )
        if not md.candidates and allow is not self.allow:  # nothing of a kind already run: any candidate
            md = decide_mixed(
                w,
                co,
                pool,
                self._link(),
                current=current,
                thresholds=th,
                allow=self.allow,
            )
        if note:
            inputs["mode_trial"] = note
        d = md.as_decision(budget, inputs, bool(ov.force_mode) or ov.freeze)
        return self._act(md.configuration, borrow, replace(d, gate=g))

    def _step_kind(
        self,
        ctx: PolicyContext,
        w: WorkloadProfile,
        co: Mapping[str, EngineCoefficients],
        pool: Mapping[str, int],
        allow: Callable[[Candidate], bool] | None,
        current: Configuration | None,
        th: Thresholds,
    ) -> tuple[Callable[[Candidate], bool] | None, str]:
        """At a step start while the trainer runs: the kind (colocated, or a disaggregated split's chip per role)
        for the whole step. Within the step only membership changes, so the kind chosen now is the one the overlap
        workers lent at Training Finished must join; a kind that cannot use them (a cross-type split whose decode
        pool is the bottleneck) looks best on the dedicated pool and then runs the rest of the step without them.
        Each kind is priced as the step will run it: the dedicated pool until Training Finished (the trainer's
        remaining time t1, from the window last seen), then the dedicated pool plus the lent workers, the same
        two-phase reading as Eq. 7: T = t1 + (1 − t1/T_ded)·T_full (T_ded when it ends before t1)."""
        win, tb = self._window, self._tb_s
        if win is None or tb is None or not ctx.training_active or not ctx.overrides.borrowing:
            return None, ""
        train_s, oh, n_ovl = win
        t1 = max(0.0, tb + train_s - ctx.now_s)
        if n_ovl <= 0 or t1 <= 0:
            return None, ""
        trackers = self._trackers()
        trackers.add(oh, get_profile(oh, self.profile.model, self.profile.tp))
        co_full = {**co, oh: trackers.by_type[oh].coefficients(w)[0]}
        full = dict(pool)
        full[oh] = full.get(oh, 0) + n_ovl

        def best(cands: list[Candidate]) -> dict[str, float]:
            out: dict[str, float] = {}
            for c in cands:
                if c.feasible and (allow is None or allow(c)):
                    g = _group(c.configuration)
                    out[g] = min(out.get(g, math.inf), c.makespan_s)
            return out

        t_ded = best(evaluate_mixed(w, co, pool, self._link()))
        t_full = best(evaluate_mixed(w, co_full, full, self._link()))
        if not t_ded:
            return None, ""
        step = {g: t if t <= t1 else t1 + (1.0 - t1 / t) * min(t_full.get(g, t), t) for g, t in t_ded.items()}
        pick = min(step, key=lambda g: step[g])
        g0 = _group(current) if current is not None else None
        if g0 in step and g0 != pick and (step[g0] - step[pick]) / step[g0] <= th.mode_switch:
            pick = g0
        why = (
            f"the step's kind priced over its borrow window (t1 = {t1:.0f} s on the dedicated pool, then "
            f"+{n_ovl} {oh}): " + ", ".join(f"{g} {t:.0f} s" for g, t in sorted(step.items(), key=lambda x: x[1])[:3])
        )
        return (lambda c: _group(c.configuration) == pick and (allow is None or allow(c))), why

    def _gate_times(self, ctx: PolicyContext, w: WorkloadProfile, t_ded: float, t_full: float) -> GateResult:
        """Eq. 7 on the dedicated and the full pool's predicted makespans (admitted anyway when ungated)."""
        g = gate(
            remaining=ctx.remaining,
            batch_size=ctx.batch_size or w.batch_size,
            t_dedicated_s=t_ded,
            t_full_s=t_full,
            toggle_s=self.tracker.toggle.value,
        )
        if not self.gated:
            return replace(g, admit=True, reason=f"ungated (ablation): borrow; Eq. 7 would say: {g.reason}")
        return g


def _chip(name: str) -> str:
    """A record's chip type by its canonical name ("" if none or unknown)."""
    try:
        return get_hardware(name).name if name else ""
    except ValueError:
        return ""


def _may_borrow(ctx: PolicyContext) -> bool:
    """Overlap workers may be lent now: borrowing allowed, the trainer idle, and not at Training Begin."""
    return (
        ctx.overrides.borrowing
        and not ctx.training_active
        and ctx.overlap_workers > 0
        and ctx.signal is not Signal.TRAINING_BEGIN
    )


def _kind(cfg: Configuration) -> str:
    return f"{cfg.mode}|{cfg.prefill_hardware}|{cfg.decode_hardware}"


def _group(cfg: Configuration) -> str:
    """What a step start chooses for the step: colocated (over whichever types), or a split's chip per role."""
    return "colocated" if cfg.mode is Mode.COLOCATED else _kind(cfg)


def _same_kind(a: Configuration, b: Configuration) -> bool:
    """No surviving worker changes role between a and b: both colocated (whichever types: workers only join
    or leave), or both disaggregated with the same chip type per role."""
    if a.mode is Mode.COLOCATED and b.mode is Mode.COLOCATED:
        return True
    return _kind(a) == _kind(b)


def _types(cfg: Configuration) -> set[str]:
    return {h for h in f"{cfg.prefill_hardware}+{cfg.decode_hardware}".split("+") if h}


def _keeps_running(cand: Configuration, cur: Configuration, present: set[str]) -> bool:
    """Mid-step, a colocated configuration keeps every chip type it runs on that the pool still has: only the
    pool takes running workers away (preemption, Training Begin). Dropping a running worker re-homes its
    trajectories, whose prefix caches are lost and re-prefilled elsewhere (a cost Eq. 1 does not price). The
    balanced price (the router homes by chip speed) never prices a subset of the types faster than all of
    them, so this rule now only guards that invariant: a drop would lose caches no candidate's price holds."""
    if cand.mode is not Mode.COLOCATED or cur.mode is not Mode.COLOCATED:
        return True
    return (_types(cur) & present) <= _types(cand) or not _types(cur)


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


class BestHomogeneousPolicy(PearlPolicy):
    """The best-homogeneous baseline (issue 23): PEARL confined to one chip type — on a mixed pool it plans over
    the candidates that run on a single type (colocated or disaggregated within it) and leaves the other types'
    GPUs unused; on a pool of one type it is PEARL. What a homogeneous system does given its best chip."""

    name = names.BEST_HOMOGENEOUS
    summary = "Best homogeneous: PEARL on the best single chip type of a mixed pool (the other types unused)"
    product = False
    listed = False
    color = "#8c564b"
    single_type_only = True
    mixed_pools_only = True
