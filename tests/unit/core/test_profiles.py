"""Profiles: contract, model/hardware constants, and calibration against measured anchors (pd_anchors §4.4)."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, replace

import numpy as np
import pytest

from controlplane.core.profiles import ReconfigCosts, get_profile, get_reconfig_costs


def test_lookup_is_case_insensitive_and_unknown_names_raise() -> None:
    assert get_profile("h800", "Qwen3-8B") == get_profile("H800", "qwen3-8b")
    with pytest.raises(ValueError, match="B200"):
        get_profile("B200", "qwen3-8b")
    with pytest.raises(ValueError, match="llama"):
        get_profile("H800", "llama-70b")
    with pytest.raises(ValueError):
        get_profile("H800", "qwen3-8b", tp=0)


def test_profile_is_frozen() -> None:
    p = get_profile("H800", "qwen3-8b")
    with pytest.raises(FrozenInstanceError):
        p.decode_a = 1.0  # type: ignore[misc]


def test_kv_bytes_per_token_and_weights_match_model_configs() -> None:
    assert get_profile("H800", "qwen3-8b").kv_bytes_per_token == 147_456  # 144 KiB
    assert get_profile("H800", "qwen3-30b-a3b").kv_bytes_per_token == 98_304  # 96 KiB
    assert get_profile("H800", "qwen3-8b").weight_bytes == pytest.approx(16.4e9, rel=0.01)
    assert get_profile("H800", "qwen3-30b-a3b").weight_bytes == pytest.approx(61.0e9, rel=0.01)
    assert get_profile("cpu", "tiny").kv_bytes_per_token == 2 * 2 * 2 * 32 * 4


def test_moe_weight_reads_follow_expert_activation() -> None:
    """pd_anchors §4.3: W(B) for 30B-A3B BF16 ≈ 6.1 / 25.8 / 53.1 / 59.5 GB at B = 1 / 8 / 32 / 64."""
    spec = get_profile("H800", "qwen3-30b-a3b").spec
    for batch, gb in [(1, 6.1), (8, 25.8), (32, 53.1), (64, 59.5)]:
        assert spec.decode_weight_bytes(batch) / 1e9 == pytest.approx(gb, rel=0.05)
    assert spec.experts_touched(1) == pytest.approx(8.0)


def test_decode_anchor_qwen3_8b_h100() -> None:
    """gpustack: Qwen3-8B BF16, 1×H100, concurrency 4, TPOT 7.19–7.38 ms (ShareGPT, ~1k context)."""
    p = get_profile("H100", "qwen3-8b", tp=1)
    t = p.decode_iteration_s(4, 1000)
    assert 7.19e-3 * 0.9 <= t <= 7.38e-3 * 1.1


def test_decode_anchor_qwen3_30b_fp8_h200() -> None:
    """vLLM note: Qwen3-30B-A3B-FP8, H200 TP1, 32k context, concurrency 10: pure-decode TPOT 16.02 ms."""
    p = get_profile("H200", "qwen3-30b-a3b", tp=1)
    fp8 = replace(p, spec=replace(p.spec, weight_dtype_bytes=1.0))
    assert fp8.decode_iteration_s(10, 32768) == pytest.approx(16.02e-3, rel=0.10)


def test_prefill_anchor_qwen3_8b_isl_8000() -> None:
    """Dynamo #10528: one Qwen3-8B prefill replica saturates at ~36k prompt tok/s (ISL 8000)."""
    p = get_profile("H100", "qwen3-8b", tp=1)
    tok_s = 8000 / p.prefill_s(8000)
    assert tok_s == pytest.approx(36_000, rel=0.15)


def test_prefill_anchor_h20_infersim() -> None:
    """InferSim (SGLang-measured) H20: Qwen3-30B-A3B BF16 prefill 16,594 tok/s/GPU at ISL 4096."""
    p = get_profile("H20", "qwen3-30b-a3b", tp=1)
    assert 4096 / p.prefill_s(4096) == pytest.approx(16_594, rel=0.15)


def test_prefill_has_quadratic_attention_and_prefix_terms() -> None:
    p = get_profile("H800", "qwen3-8b")
    assert p.prefill_s(8000) > 4 * p.prefill_s(2000)  # superlinear in n
    assert p.prefill_s(1000, prefix=16000) > p.prefill_s(1000)  # attends over the cached prefix
    assert p.prefill_s(0) == 0.0


def test_decode_iteration_grows_with_batch_and_context_and_is_vectorised() -> None:
    p = get_profile("H800", "qwen3-30b-a3b")
    b = np.array([1.0, 4.0, 16.0, 64.0])
    t = p.decode_iteration_s(b, 8192)
    assert isinstance(t, np.ndarray)  # an array of batch sizes gives an array
    assert np.all(np.diff(t) > 0)
    assert p.decode_iteration_s(8, 16000) > p.decode_iteration_s(8, 1000)
    assert t[1] == pytest.approx(p.decode_iteration_s(4.0, 8192))


@pytest.mark.parametrize("model,tol", [("qwen3-8b", 0.01), ("qwen3-30b-a3b", 0.30)])
def test_linear_coefficients_track_the_fine_model(model: str, tol: float) -> None:
    """The headline A + b·batch is a least-squares fit of decode_iteration_s over batches 1..128:
    exact for dense models; a secant for MoE, whose E(B) curve is concave (hence the predictor uses
    the MoE term of EngineCoefficients, not this line)."""
    p = get_profile("H800", model)
    for batch in (8, 32, 128):
        fine = p.decode_iteration_s(batch, p.reference_context)
        assert p.decode_a + p.decode_b * batch == pytest.approx(fine, rel=tol)
    c = p.coefficients(mean_context=p.reference_context)
    for batch in (1, 8, 32, 128):
        assert c.decode_iteration_s(batch) == pytest.approx(p.decode_iteration_s(batch, p.reference_context), rel=0.02)


def test_tp2_worker_holds_more_kv_and_is_faster_than_tp1() -> None:
    one, two = get_profile("H800", "qwen3-8b", tp=1), get_profile("H800", "qwen3-8b", tp=2)
    assert two.hbm_kv_capacity > 2 * one.hbm_kv_capacity  # weights are paid once per worker
    assert two.decode_iteration_s(16, 8000) < one.decode_iteration_s(16, 8000)
    assert two.prefill_s(4000) < one.prefill_s(4000)
    with pytest.raises(ValueError, match="does not fit"):
        get_profile("cpu", "qwen3-8b")


def test_reconfig_costs_are_table_3() -> None:
    c8, c30 = get_reconfig_costs("qwen3-8b"), get_reconfig_costs("Qwen3-30B-A3B")
    assert (c8.inter_scale_preparation_s, c8.inter_scale_finalisation_s) == (56.29, 11.05)
    assert (c8.intra_scale_activation_s, c8.intra_scale_deactivation_s) == (6.26, 3.18)
    assert (c30.inter_scale_preparation_s, c30.inter_scale_finalisation_s) == (67.06, 17.89)
    assert (c30.intra_scale_activation_s, c30.intra_scale_deactivation_s) == (6.09, 4.38)
    assert c8.toggle_s == pytest.approx(9.44)
    assert get_profile("H800", "qwen3-8b").reconfig is c8
    tiny = get_reconfig_costs("tiny")
    assert isinstance(tiny, ReconfigCosts) and tiny.toggle_s < c8.toggle_s
    assert c8.role_change_s(drain_s=2.0) == pytest.approx(2.007)


def test_every_hardware_model_pair_that_fits_has_positive_coefficients() -> None:
    for hw in ("H800", "H100", "H200", "H20"):
        for model in ("qwen3-8b", "qwen3-30b-a3b", "tiny"):
            p = get_profile(hw, model)
            for v in (
                p.t_prefill,
                p.decode_a,
                p.decode_b,
                p.hbm_kv_capacity,
                p.bandwidth,
                p.train_tokens_per_s_per_gpu,
            ):
                assert v > 0, (hw, model)
    cpu = get_profile("cpu", "tiny")
    assert 2e-3 < cpu.decode_iteration_s(8, 300) < 8e-3  # platform_notes §5: ~3–4 ms per step at B=8


def test_plateau_batch_is_where_decode_throughput_levels_off_within_the_kv_cache() -> None:
    from controlplane.core.profiles import plateau_batch

    p = get_profile("H800", "qwen3-8b", 2)
    c = p.coefficients(mean_context=16384)
    n = plateau_batch(c, 16384)
    kv_bound = int(c.hbm_kv_capacity // (c.kv_bytes_per_token * 16384))
    assert 1 < n < kv_bound
    thr = lambda b: b / c.decode_iteration_s(b)
    assert thr(n) >= 0.9 * thr(kv_bound) > thr(n - 1)
    assert plateau_batch(c, 16384, frac=0.95) > n  # a stricter plateau needs a bigger batch
    assert plateau_batch(c, 4096) > n  # shorter contexts: more sequences fit and b is smaller
