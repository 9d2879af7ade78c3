"""PEARL's policy (the paper): the PD-adaptive decision on every signal and gated borrowing."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, ClassVar

from controlplane.core.borrowing import GateResult, gate
from controlplane.core.context import PolicyContext, Signal
from controlplane.core.decision import Thresholds, decide
from controlplane.core.policies import names
from controlplane.core.policies.base import OptionSpec, PolicyAction, TrackedPolicy, best_makespan, with_inputs
from controlplane.core.predictor import WorkloadProfile
from controlplane.core.profiles import EngineCoefficients
from controlplane.core.state import Configuration
from controlplane.core.tracker import FittedProfile

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
        w, c, fp = self.fitted(ctx)
        dedicated = self._dedicated(ctx)
        ov = ctx.overrides
        thresholds, trial_note = self._thresholds(ctx, fp)
        borrow, g = 0, None
        can_borrow = (
            ov.borrowing
            and not ctx.training_active
            and ctx.overlap_workers > 0
            and ctx.signal is not Signal.TRAINING_BEGIN
        )
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
        t_ded = best_makespan(w, c, n_ded)
        t_full = best_makespan(w, c, n_full)
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
