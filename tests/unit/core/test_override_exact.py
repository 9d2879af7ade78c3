"""Forced P:D overrides: a ratio scaled to the worker budget, or exact worker counts."""

from __future__ import annotations

from controlplane.core.context import Overrides, PolicyContext, Signal
from controlplane.core.decision import decide
from controlplane.core.policies import make_policy
from controlplane.core.profiles import get_profile
from controlplane.core.state import Configuration, Mode
from tests.unit.core.test_decision import paper_setup


def test_ratio_is_scaled_to_the_budget() -> None:
    w, c = paper_setup()
    d = decide(w, c, 6, overrides=Overrides(force_ratio=(1, 3)))
    assert d.label == "2P4D" and d.overridden  # 6 * 1/4 = 1.5 -> 2 prefill: the README's old surprise
    assert "ratio 1:3 gives 2P4D on 6 workers" in d.reason


def test_exact_counts_leave_spare_workers_unused() -> None:
    w, c = paper_setup()
    d = decide(w, c, 6, overrides=Overrides(force_ratio=(1, 3), exact_ratio=True))
    assert d.configuration == Configuration.disaggregated(1, 3) and d.overridden and d.admitted
    assert "exact 1P3D on 6 workers, 2 left unused" in d.reason
    assert d.predicted_makespan_s > 0 and d.predicted_makespan_s != float("inf")  # predicted on its 4 workers


def test_exact_counts_above_the_budget_fall_back_to_the_ratio() -> None:
    w, c = paper_setup()
    d = decide(w, c, 2, overrides=Overrides(force_ratio=(1, 3), exact_ratio=True))
    assert d.configuration == Configuration.disaggregated(1, 1)
    assert "needs 4 workers" in d.reason


def test_pearl_policy_borrows_no_worker_an_exact_override_leaves_idle() -> None:
    profile = get_profile("h800", "qwen3-8b", tp=2)
    policy = make_policy("pearl", profile=profile, batch_size=64)
    ctx = PolicyContext(
        now_s=0.0,
        signal=Signal.STEP_START,
        dedicated_workers=4,
        reserved_workers=4,
        overlap_workers=2,
        training_active=False,
        current=None,
        borrowed=0,
        batch_size=64,
        remaining=64,
        overrides=Overrides(force_ratio=(1, 3), exact_ratio=True),
    )
    action = policy.on_event(ctx)
    assert action.borrow == 0 and action.target == Configuration.disaggregated(1, 3)
    assert action.target.mode is Mode.DISAGGREGATED
