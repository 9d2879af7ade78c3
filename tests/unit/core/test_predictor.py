"""Predictor: Eq. 1–3 by hand, the capacity constraints, and properties."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.core.predictor import (
    FeasibilityRule,
    WorkloadProfile,
    disaggregated_table,
    min_workers_for_kv,
    predict,
    predict_colocated,
    predict_disaggregated,
    swe_bench_workload,
)
from controlplane.core.profiles import EngineCoefficients, get_profile
from controlplane.core.state import Configuration

# Round numbers so the hand computations below are exact.
C = EngineCoefficients(
    t_prefill=1e-5, decode_a=5e-3, decode_b=2e-4, kv_bytes_per_token=1e5, hbm_kv_capacity=1e11, bandwidth=5e10
)
W = WorkloadProfile(
    batch_size=64,
    turns=10,
    new_prompt_tokens=1000,
    generated_tokens=50,
    env_time_s=20.0,
    theta=0.5,
    kv_seq_tokens=20_000,
    mean_context=10_000,
    overhead_s=0.1,
)


def test_colocated_is_eq_1() -> None:
    p = predict_colocated(W, C, 8)
    prefill = 10 * (64 * 1000 / 8) * 1e-5
    decode = 10 * 50 * (5e-3 + 2e-4 * 64 / 8)
    assert p.prefill_s == pytest.approx(prefill)
    assert p.decode_s == pytest.approx(decode)
    assert p.overhead_s == pytest.approx(1.0)
    assert p.makespan_s == pytest.approx(prefill + decode + 1.0 + 20.0)
    assert p.feasible


def test_disaggregated_is_eq_2_and_3() -> None:
    p = predict_disaggregated(W, C, 3, 5)
    t_pre = 10 * 64 * 1000 * 1e-5 / 3
    kv = 10 * 64 * 1000 * 1e5 / (5e10 * 3)  # min(N_P, N_D) = 3 links
    t_dec = 10 * 50 * (5e-3 + 2e-4 * 64 / (5 * 1.5)) * 1.5
    assert p.prefill_s == pytest.approx(t_pre)
    assert p.kv_transfer_s == pytest.approx(kv)
    assert p.decode_s == pytest.approx(t_dec)
    assert p.makespan_s == pytest.approx(max(t_pre + kv, t_dec) + 20.0)
    shared = predict_disaggregated(W, replace(C, shared_kv_fabric=True), 3, 5)
    assert shared.kv_transfer_s == pytest.approx(3 * kv)  # the paper's literal fixed BW


def test_decode_kv_constraint() -> None:
    need = 64 * 20_000 * 1e5  # B·K_seq = 1.28e11 -> N_D >= 2
    assert min_workers_for_kv(W, C) == 2 == int(np.ceil(need / 1e11))
    assert not predict_disaggregated(W, C, 7, 1).feasible
    assert "KV" in predict_disaggregated(W, C, 7, 1).why_infeasible
    assert predict_disaggregated(W, C, 6, 2).feasible or "prefill" in predict_disaggregated(W, C, 6, 2).why_infeasible
    assert not predict_colocated(W, C, 1).feasible


def test_prefill_keepup_rule() -> None:
    heavy = replace(W, new_prompt_tokens=20_000)
    p = predict_disaggregated(heavy, C, 1, 7)
    assert p.prefill_s + p.kv_transfer_s > 1.5 * p.decode_s
    assert not p.feasible and "keep up" in p.why_infeasible
    assert predict_disaggregated(heavy, C, 1, 7, FeasibilityRule(prefill_keepup=1e9)).feasible


def test_table_matches_scalar_predictions() -> None:
    t = disaggregated_table(W, C, 9)
    assert list(t.n_prefill) == list(range(1, 9)) and list(t.n_decode) == list(range(8, 0, -1))
    for i in range(8):
        p = predict_disaggregated(W, C, int(t.n_prefill[i]), int(t.n_decode[i]))
        assert t.makespan_s[i] == pytest.approx(p.makespan_s)
        assert bool(t.feasible[i]) == p.feasible
    assert predict(W, C, Configuration.colocated(4)).makespan_s == predict_colocated(W, C, 4).makespan_s


def test_moe_decode_uses_expert_activation() -> None:
    p = get_profile("H800", "qwen3-30b-a3b")
    w = swe_bench_workload(32)
    c = p.coefficients(new_tokens=w.new_prompt_tokens, prefix=w.prefix_tokens, mean_context=w.mean_context)
    assert c.moe_experts == 128 and c.decode_a_moe > 0
    # two sequences per worker touch far fewer experts than sixteen
    assert c.decode_iteration_s(16) - c.decode_iteration_s(2) > 7 * c.decode_b * 2


workloads = st.builds(
    WorkloadProfile,
    batch_size=st.integers(1, 256),
    turns=st.floats(1, 60),
    new_prompt_tokens=st.floats(10, 20_000),
    generated_tokens=st.floats(1, 2000),
    env_time_s=st.floats(0, 500),
    theta=st.floats(0, 3),
    kv_seq_tokens=st.floats(100, 40_000),
    mean_context=st.floats(0, 20_000),
    prefix_tokens=st.floats(0, 20_000),
    overhead_s=st.floats(0, 1),
)


@settings(max_examples=150, deadline=None)
@given(w=workloads, n=st.integers(1, 64), model=st.sampled_from(["qwen3-8b", "qwen3-30b-a3b"]))
def test_more_workers_never_predict_a_longer_makespan(w: WorkloadProfile, n: int, model: str) -> None:
    """Property: the best feasible makespan is non-increasing in the budget (per mode and overall)."""
    c = get_profile("H800", model).coefficients(
        new_tokens=w.new_prompt_tokens, prefix=w.prefix_tokens, mean_context=w.mean_context
    )
    rule = FeasibilityRule()
    col = [predict_colocated(w, c, k).makespan_s for k in (n, n + 1)]
    assert col[1] <= col[0] + 1e-9
    # disaggregated: for every split of n, the split with one more decode worker is no slower
    t_n = disaggregated_table(w, c, n + 1, rule)
    t_n1 = disaggregated_table(w, c, n + 2, rule)
    if len(t_n.makespan_s):
        assert np.all(t_n1.makespan_s[: len(t_n.makespan_s)] <= t_n.makespan_s + 1e-9)
