"""Runtime tracker: prior fallback, robust recency-weighted refits, confidence."""

from __future__ import annotations

import numpy as np
import pytest

from controlplane.core.predictor import swe_bench_workload
from controlplane.core.profiles import get_profile
from controlplane.core.telemetry import decode_iteration, kv_transfer, prefill, step, toggle, turn
from controlplane.core.tracker import RuntimeTracker, huber_fit, weighted_median

PROFILE = get_profile("H800", "qwen3-8b")


def test_falls_back_to_the_static_profile_without_data() -> None:
    tr = RuntimeTracker(PROFILE, batch_size=64)
    fp = tr.fitted()
    w = swe_bench_workload(64)
    prior = PROFILE.coefficients(new_tokens=w.new_prompt_tokens, prefix=w.prefix_tokens, mean_context=w.mean_context)
    assert fp.workload == w
    assert fp.coefficients == prior
    assert all(e.confidence == 0.0 and not e.fitted for e in fp.estimates.values())
    assert fp.toggle_s == pytest.approx(PROFILE.reconfig.toggle_s)
    assert not fp.measured  # the arbiter does not take this prior's word (core.arbiter.JobDemand.measured)


def _noisy_decode(
    tr: RuntimeTracker, rng: np.random.Generator, a: float, b: float, n: int, outliers: float = 0.05
) -> None:
    for _ in range(n):
        batch = int(rng.integers(1, 64))
        t = (a + b * batch) * (1 + 0.05 * rng.standard_normal())
        if rng.random() < outliers:
            t *= 5  # GC pause / preempted iteration
        tr.observe(decode_iteration(running_batch=batch, duration_s=float(t)))


def test_decode_fit_is_robust_to_noise_and_outliers() -> None:
    rng = np.random.default_rng(0)
    tr = RuntimeTracker(PROFILE, batch_size=64)
    _noisy_decode(tr, rng, 6e-3, 3e-4, 400)
    c, est = tr.coefficients()
    assert c.decode_a == pytest.approx(6e-3, rel=0.05)
    assert c.decode_b == pytest.approx(3e-4, rel=0.05)
    assert est["A"].fitted and est["A"].confidence > 0.5


def test_recent_steps_outweigh_old_ones() -> None:
    rng = np.random.default_rng(1)
    tr = RuntimeTracker(PROFILE, batch_size=64, iteration_half_life=100)
    _noisy_decode(tr, rng, 6e-3, 3e-4, 600, outliers=0)
    _noisy_decode(tr, rng, 9e-3, 3e-4, 600, outliers=0)
    c, _ = tr.coefficients()
    assert c.decode_a == pytest.approx(9e-3, rel=0.05)


def test_confidence_grows_with_data_and_needs_a_minimum() -> None:
    rng = np.random.default_rng(2)
    tr = RuntimeTracker(PROFILE, batch_size=64, min_engine_samples=20)
    _noisy_decode(tr, rng, 6e-3, 3e-4, 10)
    assert not tr.coefficients()[1]["A"].fitted  # below the minimum: prior in use
    _noisy_decode(tr, rng, 6e-3, 3e-4, 30)
    low = tr.coefficients()[1]["A"].confidence
    _noisy_decode(tr, rng, 6e-3, 3e-4, 400)
    assert tr.coefficients()[1]["A"].confidence > low > 0


def test_step_records_refit_the_workload_robustly() -> None:
    tr = RuntimeTracker(PROFILE, batch_size=64, min_steps=2)
    for i in range(8):
        tr.observe(
            step(
                step=i,
                batch_size=64,
                turns_max=30,
                new_prompt_tokens_mean=900.0,
                generated_tokens_mean=80.0,
                env_time_total_s=150.0,
                active_decode_fraction=0.8,
            )
        )
        assert tr.fitted().measured == (i >= 1)  # from its second step (min_steps)
    tr.observe(
        step(
            step=8,
            batch_size=64,
            turns_max=300,
            new_prompt_tokens_mean=90000.0,
            generated_tokens_mean=8000.0,
            env_time_total_s=1e5,
            active_decode_fraction=0.01,
        )
    )  # garbage
    w, est = tr.workload()
    assert (w.turns, w.new_prompt_tokens, w.generated_tokens, w.env_time_s) == (30, 900, 80, 150)
    assert w.theta == pytest.approx(0.25)
    assert est["theta"].fitted and est["S"].confidence > 0.3
    assert w.kv_seq_tokens > 30 * (900 + 80)


def test_turn_records_are_aggregated_per_step() -> None:
    tr = RuntimeTracker(PROFILE, batch_size=2, min_steps=1)
    for s in range(2):
        for traj, turns in (("a", 3), ("b", 5)):
            for t in range(turns):
                tr.observe(
                    turn(step=s, trajectory=traj, turn=t, new_prompt_tokens=1000, generated_tokens=100, env_time_s=2.0)
                )
    tr.end_step(step=1)
    w, est = tr.workload()
    assert w.turns == 5 and w.env_time_s == pytest.approx(10.0)
    assert w.new_prompt_tokens == 1000 and w.generated_tokens == 100
    assert est["S"].samples == 2


def test_prefill_bandwidth_and_toggle_refits() -> None:
    rng = np.random.default_rng(3)
    tr = RuntimeTracker(PROFILE, batch_size=64)
    for _ in range(200):
        n = int(rng.integers(256, 8192))
        tr.observe(prefill(tokens=n, duration_s=float((2e-3 + 30e-6 * n) * (1 + 0.03 * rng.standard_normal()))))
        tr.observe(kv_transfer(kv_bytes=n * 147456, duration_s=n * 147456 / 40e9))
    c, _est = tr.coefficients()
    w = tr.workload()[0]
    assert c.t_prefill == pytest.approx(30e-6 + 2e-3 / w.new_prompt_tokens, rel=0.05)
    assert c.bandwidth == pytest.approx(40e9, rel=0.01)
    for _ in range(10):
        tr.observe(toggle(activation_s=1.0, return_s=0.5))
    assert tr.toggle.value < 2.0


def test_prefill_interference_is_measured_against_prefill_alone() -> None:
    """Prefill next to running decodes that costs twice its roofline, against prefill alone at the
    roofline: I ≈ 2, the alone cost is t_prefill (what a prefill worker pays) and only the colocated
    closed form carries I. The two kinds of pass differ in size and prefix (first turns run alone),
    which the roofline normalises: with no real interference I stays 1."""
    from controlplane.core.predictor import predict_colocated, predict_disaggregated

    def feed(tr: RuntimeTracker, penalty: float, rng: np.random.Generator) -> None:
        for _ in range(300):
            alone = bool(rng.random() < 0.3)
            n, p = (
                (int(rng.integers(2000, 4000)), 0)
                if alone
                else (int(rng.integers(300, 2000)), int(rng.integers(4000, 24000)))
            )
            d = PROFILE.prefill_s(n, p) * (1.0 if alone else penalty) * (1 + 0.03 * rng.standard_normal())
            tr.observe(prefill(tokens=n, prefix_tokens=p, duration_s=float(d), running_batch=0 if alone else 6))

    plain, hot, never = (RuntimeTracker(PROFILE, batch_size=64) for _ in range(3))
    feed(plain, 1.0, np.random.default_rng(5))
    feed(hot, 2.0, np.random.default_rng(5))
    assert plain.interference().fitted and plain.interference().value == pytest.approx(1.0, abs=0.03)
    assert hot.interference().value == pytest.approx(2.0, rel=0.03)
    c_plain, est = plain.coefficients()
    c_hot, _ = hot.coefficients()
    assert est["I"].fitted and c_hot.prefill_interference == pytest.approx(2.0, rel=0.03)
    assert c_hot.t_prefill == pytest.approx(c_plain.t_prefill, rel=0.05)  # prefill alone, as measured
    w = plain.workload()[0]
    assert predict_colocated(w, c_hot, 8).prefill_s == pytest.approx(
        2 * predict_colocated(w, c_plain, 8).prefill_s, rel=0.06
    )
    assert predict_disaggregated(w, c_hot, 3, 5).prefill_s == pytest.approx(
        predict_disaggregated(w, c_plain, 3, 5).prefill_s, rel=0.05
    )
    # a pool that never mixes them (disaggregated, or a torch engine) measures no interference
    for _ in range(100):
        never.observe(prefill(tokens=2048, prefix_tokens=8000, duration_s=float(PROFILE.prefill_s(2048, 8000) * 1.7)))
    assert not never.interference().fitted and never.coefficients()[0].prefill_interference == 1.0


def test_robust_helpers() -> None:
    v = np.array([1.0, 2.0, 3.0, 100.0])
    assert weighted_median(v, np.ones(4)) in (2.0, 3.0)
    assert weighted_median(v, np.array([0, 0, 0, 1.0])) == 100.0
    x = np.arange(50, dtype=float)
    y = 2 + 0.5 * x
    y[::10] += 100
    a, b, _ = huber_fit(x, y, np.ones_like(x))
    assert a == pytest.approx(2, abs=0.5) and b == pytest.approx(0.5, abs=0.02)


def test_fitted_is_memoised_until_new_telemetry() -> None:
    tr = RuntimeTracker(PROFILE, batch_size=64, min_steps=1)
    first = tr.fitted()
    assert tr.fitted() is first
    tr.observe(
        step(
            step=1,
            batch_size=64,
            turns_max=40,
            new_prompt_tokens_mean=500.0,
            generated_tokens_mean=50.0,
            env_time_total_s=10.0,
            active_decode_fraction=0.5,
        )
    )
    second = tr.fitted()
    assert second is not first and second.workload.turns == 40


def test_huber_fit_is_weighted_least_squares_without_outliers() -> None:
    rng = np.random.default_rng(0)
    x = rng.uniform(1, 300, 200)
    y = 0.01 + 2e-4 * x + rng.normal(0, 1e-5, 200)
    w = rng.uniform(0.1, 1.0, 200)
    a, b, _ = huber_fit(x, y, w, iters=1)  # one IRLS pass: plain weighted least squares
    ref_b, ref_a = np.polyfit(x, y, 1, w=np.sqrt(w))
    assert a == pytest.approx(ref_a, rel=1e-9) and b == pytest.approx(ref_b, rel=1e-9)


def test_engine_fits_follow_each_new_record_through_their_memo() -> None:
    tr = RuntimeTracker(PROFILE, batch_size=64, min_engine_samples=4)
    for n in (1, 2, 4, 8, 16):
        tr.observe(decode_iteration(running_batch=n, duration_s=0.01 + 1e-3 * n))
    b1 = tr.coefficients()[0].decode_b
    assert tr.coefficients()[0].decode_b == b1  # nothing new: the memoised fit
    for n in (1, 2, 4, 8, 16):
        tr.observe(decode_iteration(running_batch=n, duration_s=0.01 + 3e-3 * n))
    assert tr.coefficients()[0].decode_b > b1  # refitted on the new records
