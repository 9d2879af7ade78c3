"""The decisions' rule tables: every rule decides some situation, the one the table's order says, and
`decide` / `decide_mixed` make exactly what that rule makes; a baseline's fixed decision."""

from __future__ import annotations

import math

import pytest

from controlplane.core.context import Overrides
from controlplane.core.decision import Thresholds, decide, decide_mixed, evaluate, evaluate_mixed
from controlplane.core.decision.homogeneous import RULES, Situation
from controlplane.core.decision.mixed import MIXED_RULES, MixedSituation
from controlplane.core.decision.rules import Rule, Verdict, always, first_rule, verdict
from controlplane.core.policies.baselines import fixed_decision
from controlplane.core.predictor import FeasibilityRule, WorkloadProfile, swe_bench_workload
from controlplane.core.profiles import EngineCoefficients, get_profile, link_bytes_per_s
from controlplane.core.state import Configuration

OVERRIDES = {
    "none": Overrides(),
    "freeze": Overrides(freeze=True),
    "colocated": Overrides(force_mode="colocated"),
    "disaggregated": Overrides(force_mode="disaggregated"),
    "ratio": Overrides(force_ratio=(1, 3)),
}
THRESHOLDS = {
    "default": Thresholds(),
    "zero": Thresholds(0.0, 0.0),
    "high": Thresholds(0.2, 0.5),
    "sticky": Thresholds(0.0, 0.9),  # a mode switch is never worth it
}


def _coeffs(hw: str, w: WorkloadProfile, tp: int) -> EngineCoefficients:
    return get_profile(hw, "qwen3-8b", tp).coefficients(
        new_tokens=w.new_prompt_tokens, prefix=w.prefix_tokens, mean_context=w.mean_context
    )


# (rule, batch, max trajectory tokens, chip, budget, current label, overrides, thresholds): one situation each
# rule decides (Qwen3-8B, TP2), found by a search over such situations
HOMOGENEOUS_CASES = [
    ("no rollout workers", 64, 8192, "H800", 0, "1C", "ratio", "default"),
    ("override: forced ratio", 512, 32768, "H800", 3, "2P1D", "ratio", "default"),
    ("no feasible configuration", 512, 8192, "H800", 2, None, "freeze", "default"),
    ("first configuration", 64, 32768, "H20", 7, None, "none", "high"),
    ("override: forced mode", 64, 32768, "H800", 16, "6P10D", "colocated", "default"),
    ("budget changed, none of its mode", 512, 8192, "H800", 10, "1P11D", "none", "default"),
    ("budget changed, its mode kept", 8, 8192, "H800", 6, "6P2D", "disaggregated", "high"),
    ("budget changed, mode switched", 8, 32768, "H800", 5, "2P1D", "none", "zero"),
    ("budget changed, mode switch not worth it", 8, 32768, "H800", 7, "6P3D", "none", "default"),
    ("current infeasible", 512, 8192, "H800", 15, "7P8D", "none", "high"),
    ("frozen by override", 8, 8192, "H20", 5, "4P1D", "freeze", "zero"),
    ("still the best", 64, 8192, "H20", 1, "1C", "ratio", "default"),
    ("switch admitted", 8, 8192, "H800", 6, "1P5D", "none", "zero"),
    ("ratio change within the mode", 8, 8192, "H800", 10, "5P5D", "none", "sticky"),
    ("kept by hysteresis", 8, 8192, "H20", 13, "8P5D", "none", "default"),
]


def test_every_rule_of_each_table_is_named_once_and_the_last_always_holds() -> None:
    for table in (RULES, MIXED_RULES):
        names = [r.name for r in table]
        assert len(set(names)) == len(names)
        assert table[-1].holds is always
    assert [c[0] for c in HOMOGENEOUS_CASES] == [r.name for r in RULES]
    assert [c[0] for c in MIXED_CASES] == [r.name for r in MIXED_RULES]


def test_the_first_rule_that_holds_decides_and_its_verdict_reads_the_situation() -> None:
    rules: tuple[Rule[int, int], ...] = (
        Rule("negative", lambda n: n < 0, takes=abs, admitted=False, forced=True, reason=lambda n: "negative"),
        Rule(
            "small",
            lambda n: n < 10,
            takes=lambda n: n + 1,
            current_s=float,
            admitted=lambda n: n % 2 == 1,
            forced=False,
            overridden=True,
            reason=lambda n: f"small {n}",
        ),
        Rule("any", always, takes=lambda n: 9, admitted=True, forced=False, reason=lambda n: "large"),
    )
    assert [verdict(rules, n) for n in (-5, 3, 4, 50)] == [
        Verdict("negative", 5, None, False, True, False, "negative"),
        Verdict("small", 4, 3.0, True, False, True, "small 3"),
        Verdict("small", 5, 4.0, False, False, True, "small 4"),
        Verdict("any", 9, None, True, False, False, "large"),
    ]
    with pytest.raises(AssertionError):
        first_rule(rules[:1], 3)


@pytest.mark.parametrize("case", HOMOGENEOUS_CASES, ids=[c[0] for c in HOMOGENEOUS_CASES])
def test_decide_is_made_by_the_first_rule_that_holds(case: tuple) -> None:
    name, batch, tokens, hw, budget, label, ov, th = case
    w = swe_bench_workload(batch, tokens)
    c = _coeffs(hw, w, 2)
    current = Configuration.parse(label) if label else None
    situation = Situation(w, c, budget, current, OVERRIDES[ov], THRESHOLDS[th], FeasibilityRule())
    rule = first_rule(RULES, situation)
    assert rule.name == name
    made = situation.decision(rule.verdict(situation))
    d = decide(w, c, budget, current=current, overrides=OVERRIDES[ov], thresholds=THRESHOLDS[th])
    assert (d.configuration, d.reason, d.admitted, d.forced, d.overridden) == (
        made.configuration,
        made.reason,
        made.admitted,
        made.forced,
        made.overridden,
    )


# (rule, batch, max trajectory tokens, workers per chip type, current label, thresholds); Qwen3-8B, TP1
MIXED_CASES = [
    ("no rollout workers", 512, 32768, {"H800": 0, "H20": 0}, None, "default"),
    ("no feasible configuration", 512, 32768, {"H800": 1, "H20": 2}, None, "sticky"),
    ("first configuration", 64, 8192, {"H800": 2, "H20": 2}, None, "sticky"),
    ("current gone or infeasible", 64, 8192, {"H800": 1, "H20": 4}, "1C(H800)", "zero"),
    ("pool changed, kind kept", 8, 32768, {"H800": 0, "H20": 4}, "2P3D(H20)", "high"),
    ("pool changed, switched", 8, 32768, {"H800": 1, "H20": 4}, "5C(H20)", "default"),
    ("still the best", 8, 32768, {"H800": 1, "H20": 0}, "1C(H800)", "zero"),
    ("switch admitted", 8, 8192, {"H800": 2, "H20": 1}, "2C(H800)", "zero"),
    ("ratio change within the kind", 8, 32768, {"H800": 4, "H20": 2}, "2P2D(H800)", "sticky"),
    ("kept by hysteresis", 64, 8192, {"H800": 4, "H20": 4}, "4C(H800)", "sticky"),
]


@pytest.mark.parametrize("case", MIXED_CASES, ids=[c[0] for c in MIXED_CASES])
def test_decide_mixed_is_made_by_the_first_rule_that_holds(case: tuple) -> None:
    name, batch, tokens, workers, label, th = case
    w = swe_bench_workload(batch, tokens)
    coeffs = {h: _coeffs(h, w, 1) for h in ("H800", "H20")}
    current = Configuration.parse(label) if label else None
    cands = evaluate_mixed(w, coeffs, workers, link_bytes_per_s)
    situation = MixedSituation(w, cands, current, THRESHOLDS[th])
    rule = first_rule(MIXED_RULES, situation)
    assert rule.name == name
    assert decide_mixed(w, coeffs, workers, link_bytes_per_s, current=current, thresholds=THRESHOLDS[th]) == (
        situation.decision(rule.verdict(situation))
    )


def test_a_baselines_fixed_decision_is_admitted_and_predicted_by_the_engine() -> None:
    w = swe_bench_workload(64, 32768)
    c = _coeffs("H800", w, 2)
    cfg = Configuration.colocated(6)
    d = fixed_decision(w, c, cfg, "fixed pool", {"pool": 6})
    col = evaluate(w, c, 6).colocated
    assert col is not None and d.predicted_makespan_s == col.makespan_s
    assert (d.configuration, d.budget, d.best, d.admitted, d.forced, d.overridden) == (cfg, 6, cfg, True, False, False)
    assert (d.reason, d.inputs, d.current_makespan_s, d.expected_gain) == ("fixed pool", {"pool": 6}, None, 0.0)
    assert math.isinf(fixed_decision(w, c, Configuration.colocated(0), "none", {}).predicted_makespan_s)
