"""The tracker's two guards against the closed forms: the trajectory length cap on K_seq, and the
online per-mode makespan correction (observed / predicted)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from controlplane.core import telemetry as tm
from controlplane.core.decision import decide
from controlplane.core.predictor import predict_colocated, swe_bench_workload
from controlplane.core.profiles import get_profile
from controlplane.core.state import Configuration
from controlplane.core.tracker import ERROR_MIN, MAKESPAN_ERROR, SCALE_MAX, SCALE_MIN, RuntimeTracker

PROFILE = get_profile("h800", "qwen3-8b", tp=2)


def _step(i: int, **kw) -> tm.TelemetryRecord:
    base = dict(
        step=i,
        batch_size=64,
        turns_max=60,
        new_prompt_tokens_mean=900.0,
        generated_tokens_mean=60.0,
        env_time_total_s=100.0,
        active_decode_fraction=0.7,
    )
    return tm.step(**(base | kw))


def test_kseq_never_exceeds_the_trajectory_cap():
    capped = RuntimeTracker(PROFILE, batch_size=64, max_trajectory_tokens=32768)
    free = RuntimeTracker(PROFILE, batch_size=64)
    for i in range(6):
        capped.observe(_step(i))
        free.observe(_step(i))
    w_free, _ = free.workload()
    w_cap, _ = capped.workload()
    assert w_free.kv_seq_tokens > 32768  # 60 turns × 960 tokens + prompt: the uncapped estimate overshoots
    assert w_cap.kv_seq_tokens == 32768
    assert w_cap.mean_context < w_free.mean_context


def test_correction_converges_to_the_observed_bias_and_is_per_mode():
    tr = RuntimeTracker(PROFILE, batch_size=64, max_trajectory_tokens=32768)
    cfg = Configuration.colocated(8)
    for i in range(12):
        w, _ = tr.workload()
        c, _ = tr.coefficients(w)
        predicted = predict_colocated(w, c, 8).makespan_s
        raw = predicted / w.scale_colocated
        tr.observe(_step(i, makespan_s=0.8 * raw, predicted_makespan_s=predicted, mode="colocated", n_colocated=8))
    w, est = tr.workload()
    assert w.scale_colocated == pytest.approx(0.8, rel=0.02)
    assert est["scale_colocated"].fitted
    # a mode never observed borrows the pooled correction rather than staying raw
    assert w.scale_disaggregated == pytest.approx(0.8, rel=0.02)
    c, _ = tr.coefficients(w)
    raw_w = replace(w, scale_colocated=1.0)
    assert predict_colocated(w, c, 8).makespan_s == pytest.approx(0.8 * predict_colocated(raw_w, c, 8).makespan_s)
    assert decide(w, c, 8, current=cfg).predicted_makespan_s > 0


def test_correction_is_bounded_and_ignores_records_without_a_prediction():
    tr = RuntimeTracker(PROFILE, batch_size=64)
    for i in range(10):
        tr.observe(_step(i, makespan_s=100.0, predicted_makespan_s=1.0, mode="disaggregated", n_prefill=2, n_decode=6))
        tr.observe(_step(100 + i, makespan_s=100.0, predicted_makespan_s=0.0, mode="colocated", n_colocated=8))
    w, _ = tr.workload()
    assert w.scale_disaggregated == SCALE_MAX
    assert SCALE_MIN <= w.scale_colocated <= SCALE_MAX


def test_without_step_records_the_raw_model_is_used():
    tr = RuntimeTracker(PROFILE, batch_size=64)
    w, _ = tr.workload()
    assert w.scale_colocated == 1.0 and w.scale_disaggregated == 1.0
    assert swe_bench_workload(64).scale_colocated == 1.0


def test_a_jobs_own_makespan_error_replaces_the_constant_once_measured():
    """The arbiter weighs a rollout against its trainer over this error (`best_step_time`): a job whose step
    its slowest trajectory's tool calls bound is predicted 30-50% off from step to step (the draw 2jobs-s103),
    and the constant 16% had the arbiter take units from it as if its rollout surely ran under its update."""
    steady = RuntimeTracker(PROFILE, batch_size=64)
    wild = RuntimeTracker(PROFILE, batch_size=64)
    assert steady.fitted().makespan_error == MAKESPAN_ERROR  # nothing measured yet
    for i in range(8):
        steady.observe(_step(i, makespan_s=100.0 * (1.02 if i % 2 else 0.98), predicted_at_start_s=100.0))
        wild.observe(_step(i, makespan_s=100.0 * (1.3 if i % 2 else 0.75), predicted_at_start_s=100.0))
    # the first two steps were predicted by the prior, not a fitted workload: they are not the model's error
    assert steady.fitted().makespan_error == ERROR_MIN  # ~2% off: bounded below
    # the median |ln(observed / predicted)| over a normal error's (0.6745 of its standard deviation)
    assert math.log(1.3) / 0.6745 <= wild.fitted().makespan_error <= -math.log(0.75) / 0.6745
    assert wild.fitted().makespan_error > MAKESPAN_ERROR > steady.fitted().makespan_error


def test_a_step_without_a_start_forecast_says_nothing_of_the_error():
    tr = RuntimeTracker(PROFILE, batch_size=64)
    for i in range(8):
        tr.observe(_step(i, makespan_s=300.0, predicted_makespan_s=100.0, mode="colocated", n_colocated=8))
    assert tr.fitted().makespan_error == MAKESPAN_ERROR
