"""The oracle: an upper bound for reports, never a product policy."""
from __future__ import annotations

import math

from controlplane.core.context import PolicyContext, Signal
from controlplane.core.decision import Thresholds, decide
from controlplane.core.policies.base import PolicyAction, TrackedPolicy, best_makespan, with_inputs
from controlplane.core.predictor import WorkloadProfile
from controlplane.core.profiles import EngineCoefficients

class OraclePolicy(TrackedPolicy):
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
            if best_makespan(w, c, dedicated + ctx.overlap_workers) < best_makespan(w, c, dedicated):
                borrow = ctx.overlap_workers
        n = dedicated + borrow
        d = decide(w, c, n, current=None, overrides=ctx.overrides, thresholds=Thresholds(0.0, 0.0))
        horizon = self._over_future(w, c, ctx, borrow)
        d = with_inputs(d, signal=str(ctx.signal), dedicated=dedicated, borrow=borrow, step_makespan_over_future_s=horizon)
        return self._act(d.configuration, borrow, d, free=True)

    def _over_future(self, w: WorkloadProfile, c: EngineCoefficients, ctx: PolicyContext, borrow: int) -> float:
        """Fluid estimate: the step's work drains at rate 1/T(best config) of the budget in force."""
        points = sorted((p for p in ctx.future if p.time_s >= ctx.now_s), key=lambda p: p.time_s)
        left, t, n = 1.0, ctx.now_s, self._dedicated(ctx) + borrow
        for p in points:
            rate = 1.0 / best_makespan(w, c, n) if n > 0 else 0.0
            dt = p.time_s - t
            if rate * dt >= left:
                return t + left / rate - ctx.now_s
            left -= rate * dt
            t, n = p.time_s, p.dedicated_workers + borrow
        rate = 1.0 / best_makespan(w, c, n) if n > 0 else 0.0
        return (t + left / rate - ctx.now_s) if rate > 0 else math.inf
