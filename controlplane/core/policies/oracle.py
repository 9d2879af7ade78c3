"""The oracle: an upper bound for reports, never a product policy.

One oracle, in two parts. This policy is what carries its choices out: PEARL's decision engine with no
hysteresis, no mode-trial safeguard and no borrowing gate, its plans applied at zero cost. The choosing is
the simulator's (`chooses_by_simulation`): at every signal that can change what the rollout runs on, the
simulator forks itself, tries each candidate configuration × borrow choice on the real future and hands
the winner in as the context's overrides (`sim/oracle.py`). Run on its own (no overrides), it re-decides
the best configuration for the budget at every signal and borrows every idle overlap worker.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from controlplane.core.context import PolicyContext
from controlplane.core.policies import names
from controlplane.core.policies.base import OptionSpec, PolicyAction, best_makespan, with_inputs
from controlplane.core.policies.pearl import PearlPolicy
from controlplane.core.predictor import WorkloadProfile
from controlplane.core.profiles import EngineCoefficients


class OraclePolicy(PearlPolicy):
    """Upper bound: knows the future and reconfigures for free.

    It reads `ctx.future` to report the step's predicted makespan over the coming availability changes
    (`step_makespan_over_future_s` in the decision's inputs). Never a product default.
    """

    name = names.ORACLE
    summary = "Upper bound: knows the future availability and reconfigures for free (reports only)"
    product = False
    options: ClassVar[tuple[OptionSpec, ...]] = ()
    free_reconfiguration = True
    chooses_by_simulation = True
    color = "#9467bd"

    def __init__(self, **kw: Any) -> None:
        super().__init__(gate=False, ratio_change=0.0, mode_switch=0.0, mode_trial=False, **kw)

    def on_event(self, ctx: PolicyContext) -> PolicyAction:
        a = super().on_event(ctx)
        w, c, _ = self.fitted(ctx)
        d = with_inputs(a.decision, step_makespan_over_future_s=self._over_future(w, c, ctx, a.borrow))
        return self._act(a.target, a.borrow, d)

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
