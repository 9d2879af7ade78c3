"""Borrow gate (Eq. 7), toggle-cost EMA, and the return deadline at Training Begin."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from controlplane.core.borrowing import ToggleCostEstimator, gate, return_deadline
from controlplane.core.decision import decide
from controlplane.core.predictor import swe_bench_workload
from controlplane.core.profiles import get_profile, get_reconfig_costs


def _paper_times(dedicated: int, overlap: int) -> tuple[float, float]:
    w = swe_bench_workload(64)
    c = get_profile("H800", "qwen3-8b").coefficients(
        new_tokens=w.new_prompt_tokens, prefix=w.prefix_tokens, mean_context=w.mean_context
    )
    return decide(w, c, dedicated).predicted_makespan_s, decide(w, c, dedicated + overlap).predicted_makespan_s


def test_gate_refuses_borrowing_when_few_trajectories_remain() -> None:
    """Paper setting: 10 dedicated GPUs (5 workers) + 16 training GPUs (8 overlap workers), Table 3 toggle."""
    t_ded, t_full = _paper_times(5, 8)
    toggle = get_reconfig_costs("qwen3-8b").toggle_s
    assert t_ded > t_full
    assert gate(remaining=64, batch_size=64, t_dedicated_s=t_ded, t_full_s=t_full, toggle_s=toggle).admit
    few = gate(remaining=4, batch_size=64, t_dedicated_s=t_ded, t_full_s=t_full, toggle_s=toggle)
    assert not few.admit
    assert few.benefit_s == pytest.approx(4 / 64 * (t_ded - t_full))
    assert "do not borrow" in few.reason


def test_gate_threshold_is_strict_and_clamps_remaining() -> None:
    assert not gate(remaining=32, batch_size=64, t_dedicated_s=30, t_full_s=10, toggle_s=10).admit  # equal
    assert gate(remaining=33, batch_size=64, t_dedicated_s=30, t_full_s=10, toggle_s=10).admit
    assert gate(remaining=500, batch_size=64, t_dedicated_s=30, t_full_s=10, toggle_s=10).benefit_s == 20
    assert not gate(remaining=5, batch_size=0, t_dedicated_s=30, t_full_s=10, toggle_s=0).admit


@settings(max_examples=200, deadline=None)
@given(r=st.integers(1, 512), b=st.integers(1, 512), t_full=st.floats(0, 1e4), extra=st.floats(1e-6, 1e4))
def test_zero_cost_toggles_always_pass_when_borrowing_helps(r: int, b: int, t_full: float, extra: float) -> None:
    assert gate(remaining=r, batch_size=b, t_dedicated_s=t_full + extra, t_full_s=t_full, toggle_s=0.0).admit


@settings(max_examples=100, deadline=None)
@given(r=st.integers(0, 64), t_ded=st.floats(0, 1e3), t_full=st.floats(0, 1e3), toggle=st.floats(0, 100))
def test_gate_never_admits_when_borrowing_does_not_help(r: int, t_ded: float, t_full: float, toggle: float) -> None:
    assume(t_ded <= t_full)
    assert not gate(remaining=r, batch_size=64, t_dedicated_s=t_ded, t_full_s=t_full, toggle_s=toggle).admit


def test_toggle_cost_ema_is_seeded_from_table_3_and_tracks_observations() -> None:
    est = ToggleCostEstimator(get_reconfig_costs("qwen3-30b-a3b"), alpha=0.5)
    assert est.value == pytest.approx(6.09 + 4.38)
    est.observe(2.0, 1.0)
    assert est.value == pytest.approx(0.5 * 10.47 + 0.5 * 3.0)
    for _ in range(20):
        est.observe(2.0, 1.0)
    assert est.value == pytest.approx(3.0, abs=1e-3)
    assert est.samples == 21
    with pytest.raises(ValueError):
        ToggleCostEstimator(1.0, alpha=0.0)


def test_return_deadline() -> None:
    on_time = return_deadline(training_begin_s=100.0, deactivation_s=3.18, now_s=90.0)
    assert on_time.start_by_s == pytest.approx(96.82) and not on_time.missed and on_time.delay_s == 0
    late = return_deadline(training_begin_s=100.0, deactivation_s=3.18, now_s=99.0)
    assert late.missed and late.delay_s == pytest.approx(2.18)
    margin = return_deadline(training_begin_s=100.0, deactivation_s=3.0, margin_s=2.0)
    assert margin.start_by_s == 95.0
