"""PEARL's safeguard for a mode never run (issue 11, item 4): the closed form of an unmeasured mode
may only be tried for one step, at a step start, and the tried step's outcome then governs."""

from __future__ import annotations

from dataclasses import replace

from controlplane.core import telemetry as tm
from controlplane.core.context import PolicyContext, Signal
from controlplane.core.policies import make_policy
from controlplane.core.predictor import swe_bench_workload
from controlplane.core.profiles import get_profile
from controlplane.core.state import Configuration, Mode

PROFILE = get_profile("h800", "qwen3-8b", tp=2)


def _ctx(signal: Signal, current: Configuration) -> PolicyContext:
    return PolicyContext(
        now_s=0.0,
        signal=signal,
        dedicated_workers=8,
        reserved_workers=8,
        overlap_workers=0,
        training_active=False,
        current=current,
        borrowed=0,
        batch_size=64,
        remaining=64,
    )


def _policy(**options):
    # a workload (ΔL 1000, r 60, f 0.9) whose closed form rates a split slightly above 8C; no hysteresis
    options.setdefault("mode_switch", 0.0)
    pol = make_policy("pearl", profile=PROFILE, batch_size=64, max_trajectory_tokens=32768, **options)
    for i in range(4):  # colocated steps, scored exactly as predicted
        pol.observe(
            tm.step(
                step=i,
                batch_size=64,
                turns_max=25,
                generated_tokens_mean=60.0,
                new_prompt_tokens_mean=1000.0,
                env_time_total_s=50.0,
                active_decode_fraction=0.9,
                mode="colocated",
                n_colocated=8,
                makespan_s=600.0,
                predicted_makespan_s=600.0,
            )
        )
    return pol


def test_an_untried_mode_is_entered_only_at_a_step_start():
    pol = _policy()
    mid = pol.on_event(_ctx(Signal.PERIODIC, Configuration.colocated(8)))
    assert mid.target == Configuration.colocated(8)
    assert "never run" in mid.decision.inputs["mode_trial"]
    start = pol.on_event(_ctx(Signal.STEP_START, Configuration.colocated(8)))
    assert start.target.mode is Mode.DISAGGREGATED
    assert "trial" in start.decision.inputs["mode_trial"]
    # without the safeguard the closed form switches mid-step
    free = _policy(mode_trial=False).on_event(_ctx(Signal.PERIODIC, Configuration.colocated(8)))
    assert free.target.mode is Mode.DISAGGREGATED


def test_a_failed_trial_sends_the_policy_back_and_keeps_it_there():
    pol = _policy()
    trial = pol.on_event(_ctx(Signal.STEP_START, Configuration.colocated(8))).target
    predicted = pol.last_action.decision.predicted_makespan_s
    # the trial step ran 40% slower than its forecast
    pol.observe(
        tm.step(
            step=4,
            batch_size=64,
            turns_max=25,
            generated_tokens_mean=60.0,
            new_prompt_tokens_mean=1060.0,
            env_time_total_s=50.0,
            active_decode_fraction=0.9,
            mode="disaggregated",
            n_prefill=trial.n_prefill,
            n_decode=trial.n_decode,
            makespan_s=1.4 * predicted,
            predicted_makespan_s=predicted,
        )
    )
    assert pol.tracker.mode_tried("disaggregated")
    back = pol.on_event(_ctx(Signal.STEP_START, trial))
    assert back.target == Configuration.colocated(8)
    again = pol.on_event(_ctx(Signal.STEP_START, Configuration.colocated(8)))
    assert again.target == Configuration.colocated(8)


def test_the_option_is_validated():
    import pytest

    from controlplane.core.policies import OptionError, validate_options

    assert validate_options("pearl", {"mode_trial": False}) == {"mode_trial": False}
    with pytest.raises(OptionError):
        validate_options("pearl", {"mode_trial": 1})


def test_with_no_mode_run_yet_pearl_starts_colocated_as_the_baseline_it_extends():
    """Neither closed form is measured at the first placement: PEARL starts in the baseline's mode
    and leaves disaggregation to the trial, where the unfitted prior alone would start disaggregated."""
    ctx = PolicyContext(
        now_s=0.0,
        signal=Signal.STEP_START,
        dedicated_workers=5,
        reserved_workers=2,
        overlap_workers=0,
        training_active=False,
        current=None,
        borrowed=0,
        batch_size=64,
        remaining=64,
    )
    # a prior whose closed form rates a split first (the Table 2 operating point, PROFILES.md §5)
    table2 = replace(swe_bench_workload(64, prompt_to_generated=20.0), overhead_s=0.15)
    fresh = make_policy("pearl", profile=PROFILE, batch_size=64, workload=table2)
    first = fresh.on_event(ctx)
    assert first.target == Configuration.colocated(5)
    assert "starting colocated" in first.decision.inputs["mode_trial"]
    prior_only = make_policy("pearl", profile=PROFILE, batch_size=64, workload=table2, mode_trial=False).on_event(ctx)
    assert prior_only.target.mode is Mode.DISAGGREGATED
    # once a mode has been scored the rule no longer applies: the trial decides
    assert "starting colocated" not in _policy().on_event(ctx).decision.inputs.get("mode_trial", "")
