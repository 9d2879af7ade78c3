"""Policies behind one interface and one registry: pearl, fixed (ROLL), fixed-large (ROLL-Large), elastic
(elastic seeding after RLBoost), rlboost+ (RLBoost+, simulator only), oracle."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.core.context import AvailabilityPoint, Overrides, PolicyContext, Signal
from controlplane.core.decision import Decision
from controlplane.core.policies import (
    POLICIES,
    POLICY_NAMES,
    PRODUCT_POLICIES,
    REGISTRY,
    ElasticPolicy,
    FixedPolicy,
    OptionError,
    OraclePolicy,
    PearlPolicy,
    RLBoostPolicy,
    StaticPool,
    make_policy,
    names,
    rlboost_rebalance,
    validate_options,
)
from controlplane.core.profiles import get_profile
from controlplane.core.state import Configuration, Mode
from controlplane.core.telemetry import step, toggle

PROFILE = get_profile("H800", "qwen3-8b")


def ctx(**kw) -> PolicyContext:
    base: dict[str, Any] = dict(
        now_s=0.0,
        signal=Signal.STEP_START,
        dedicated_workers=5,
        reserved_workers=2,
        overlap_workers=8,
        training_active=False,
        current=None,
        borrowed=0,
        batch_size=64,
        remaining=64,
    )
    base.update(kw)
    return PolicyContext(**base)


def policy(name: str, **kw):
    if name == "fixed-large":
        kw.setdefault("trace_mean_gpus", 13.6)
    return make_policy(name, profile=PROFILE, batch_size=64, **kw)


@pytest.mark.parametrize("name", REGISTRY)
def test_every_policy_answers_with_a_valid_action_and_observes(name: str) -> None:
    p = policy(name)
    assert p.name == name
    a = p.on_event(ctx())
    assert isinstance(a.target, Configuration) and isinstance(a.decision, Decision)
    assert 0 <= a.borrow <= 8
    assert a.free_reconfiguration == (name == "oracle")
    p.observe(step(step=1, batch_size=64, turns_max=20))  # shared tracker input
    assert p.tracker.records == 1


def test_unknown_policy_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("greedy", profile=PROFILE, batch_size=64)


def test_fixed_is_roll_reserved_colocated_never_borrows() -> None:
    p = policy("fixed")
    a = p.on_event(ctx(dedicated_workers=7))
    assert a.target == Configuration.colocated(2) and a.borrow == 0


@pytest.mark.parametrize("mean,gpus", [(13.6, 14), (9.0, 10), (11.8, 12)])
def test_fixed_large_rounds_the_trace_mean_up_to_tp(mean: float, gpus: int) -> None:
    p = policy("fixed-large", trace_mean_gpus=mean)
    a = p.on_event(ctx(dedicated_workers=2))
    assert a.target == Configuration.colocated(gpus // 2) and a.borrow == 0


def test_pearl_borrows_through_the_gate_and_returns_at_training_begin() -> None:
    p = policy("pearl")
    a = p.on_event(ctx())
    assert a.borrow == 8 and a.target.total == 13 and a.target.mode is Mode.COLOCATED  # no mode run yet: the baseline's
    assert a.decision.gate.admit
    few = policy("pearl").on_event(ctx(remaining=3))
    assert few.borrow == 0 and few.target.total == 5 and not few.decision.gate.admit
    back = p.on_event(ctx(signal=Signal.TRAINING_BEGIN, current=a.target, borrowed=8, remaining=0))
    assert back.borrow == 0 and back.target.total == 5
    busy = p.on_event(ctx(training_active=True, overlap_workers=0, current=back.target))
    assert busy.borrow == 0


def test_pearl_keeps_borrowed_workers_until_training_begin() -> None:
    p = policy("pearl")
    a = p.on_event(ctx())
    later = p.on_event(ctx(signal=Signal.PERIODIC, current=a.target, borrowed=8, remaining=2))
    assert later.borrow == 8  # the activation is paid; the return happens at Training Begin anyway


def test_pearl_overrides_win() -> None:
    off = policy("pearl").on_event(ctx(overrides=Overrides(borrowing=False)))
    assert off.borrow == 0
    col = policy("pearl").on_event(ctx(overrides=Overrides(force_mode="colocated")))
    assert col.target.mode is Mode.COLOCATED
    inelastic = policy("pearl").on_event(ctx(overrides=Overrides(elasticity=False, borrowing=False)))
    assert inelastic.target.total == 2  # reserved only


def test_pearl_gate_learns_toggle_cost_from_telemetry() -> None:
    p = policy("pearl")
    for _ in range(30):
        p.observe(toggle(activation_s=200.0, return_s=100.0))
    assert p.on_event(ctx()).borrow == 0


def test_elastic_borrows_ungated_and_adapts_t_seed() -> None:
    p = policy("elastic", t_seed_s=30.0, eta=0.5)
    assert isinstance(p, ElasticPolicy)
    a = p.on_event(ctx(signal=Signal.TRAINING_FINISHED, now_s=0.0, remaining=2))
    assert a.borrow == 8 and a.target == Configuration.colocated(13)  # no gate, colocated
    expired = p.on_event(ctx(signal=Signal.PERIODIC, now_s=40.0, current=a.target, borrowed=8))
    assert expired.borrow == 0
    # Training Begin at t=100: the trainer's GPUs sat idle for 60 s after the seeding window closed
    p.on_event(ctx(signal=Signal.TRAINING_BEGIN, now_s=100.0, current=expired.target, borrowed=0))
    assert p.t_seed_s == pytest.approx(30.0 + 0.5 * 60.0)
    assert p.memo[5] == pytest.approx(60.0)
    # overshoot: still borrowed at Training Begin -> the return delays the trainer -> T_seed shrinks
    p.on_event(ctx(signal=Signal.TRAINING_FINISHED, now_s=200.0, remaining=64))
    p.on_event(ctx(signal=Signal.TRAINING_BEGIN, now_s=230.0, borrowed=8))
    assert p.t_seed_s < 60.0


def test_elastic_reuses_the_memo_when_the_instance_count_changes() -> None:
    p = policy("elastic", t_seed_s=10.0)
    p.memo[7] = 123.0
    p.on_event(ctx(dedicated_workers=5))
    p.on_event(ctx(signal=Signal.CAPACITY_CHANGE, dedicated_workers=7))
    assert p.t_seed_s == 123.0


def test_oracle_reads_the_future_and_reconfigures_for_free() -> None:
    p = policy("oracle")
    future = (AvailabilityPoint(10.0, 8), AvailabilityPoint(50.0, 2))
    a = p.on_event(ctx(remaining=1, future=future))
    assert a.free_reconfiguration and a.borrow == 8  # T_toggle = 0: any gain is worth it
    assert a.decision.inputs["step_makespan_over_future_s"] > 0
    calm = p.on_event(ctx(remaining=1))
    assert a.decision.inputs["step_makespan_over_future_s"] != calm.decision.inputs["step_makespan_over_future_s"]


def test_rlboost_rebalance() -> None:
    assert rlboost_rebalance({0: 3, 1: 0}, {0: 4, 1: 4}, plateau_batch=8) == [(0, 1, 1)]
    assert rlboost_rebalance({0: 0, 1: 0}, {0: 20, 1: 0}, plateau_batch=8) == [(0, 1, 12)]
    assert rlboost_rebalance({0: 0, 1: 0}, {0: 4, 1: 4}, plateau_batch=8) == []
    assert rlboost_rebalance({0: 1}, {0: 1}, plateau_batch=8) == []


def test_pearl_without_gate_borrows_even_for_the_last_trajectories() -> None:
    """Ablation component B without C (paper Fig. 7): every idle overlap worker is borrowed."""
    gated = policy("pearl").on_event(ctx(remaining=2))
    ungated = policy("pearl", gate=False).on_event(ctx(remaining=2))
    assert gated.borrow == 0 and ungated.borrow == 8
    assert "ungated" in ungated.decision.gate.reason


def test_one_registry_with_views_for_the_catalog_and_the_job_api() -> None:
    assert list(REGISTRY) == ["pearl", "fixed", "fixed-large", "rlboost+", "elastic", "best-homogeneous", "oracle"]
    assert POLICY_NAMES == tuple(POLICIES) == ("pearl", "fixed", "fixed-large", "elastic", "oracle")
    assert PRODUCT_POLICIES == ("pearl", "fixed", "fixed-large", "elastic")
    assert all(cls.name == n for n, cls in REGISTRY.items())
    assert {
        names.PEARL,
        names.FIXED,
        names.FIXED_LARGE,
        names.ELASTIC,
        names.RLBOOST,
        names.BEST_HOMOGENEOUS,
        names.ORACLE,
    } == set(REGISTRY)


def test_rlboost_plus_is_rlboosts_algorithm_not_an_alias_of_elastic() -> None:
    p = policy("rlboost+")
    assert type(p) is RLBoostPolicy and p.eta == pytest.approx(1 / 3) and p.cap
    assert not p.product and not p.listed and p.dispatch == "jsq"
    assert type(policy("elastic")) is ElasticPolicy and ElasticPolicy.dispatch == "sticky"
    assert validate_options("rlboost+", {"cap": False}) == {"cap": False}
    with pytest.raises(OptionError):
        validate_options("elastic", {"cap": False})
    assert type(policy("roll")) is FixedPolicy and policy("roll-large", workers=3).workers == 3


def test_traits_carry_the_behaviour_that_callers_used_to_read_from_names() -> None:
    static = {n: cls.static_pool for n, cls in REGISTRY.items() if cls.static_pool is not None}
    assert static == {"fixed": StaticPool.RESERVED, "fixed-large": StaticPool.TRACE_MEAN}
    assert [n for n, cls in REGISTRY.items() if cls.free_reconfiguration] == ["oracle"]
    assert [n for n, cls in REGISTRY.items() if cls.chooses_by_simulation] == ["oracle"]
    assert [n for n, cls in REGISTRY.items() if cls.dispatch == "jsq"] == ["rlboost+"]
    with pytest.raises(OptionError) as exc:
        validate_options("fixed-large", {})
    assert exc.value.option == "workers"


def test_one_oracle_pearls_decision_engine_without_hysteresis_trial_or_gate() -> None:
    o = policy("oracle")
    assert isinstance(o, OraclePolicy) and isinstance(o, PearlPolicy)
    assert not o.gated and not o.mode_trial and o.thresholds.ratio_change == 0.0 and o.thresholds.mode_switch == 0.0
    with pytest.raises(OptionError):
        validate_options("oracle", {"gate": True})  # its choices come in as overrides, not options
    forced = o.on_event(ctx(overrides=Overrides(force_ratio=(2, 3), exact_ratio=True, borrowing=False)))
    assert (forced.target.n_prefill, forced.target.n_decode) == (2, 3) and forced.borrow == 0
    assert forced.free_reconfiguration


def test_a_policy_name_is_spelled_only_in_the_registry() -> None:
    """Callers use `names` constants and read behaviour from a policy's traits: outside `policies/names.py`
    no module spells `fixed`, `fixed-large`, `rlboost+` or `oracle`, and none compares a value with `pearl`
    (also the project's name, so only comparisons count). `elastic` is also a pool's name: not checked."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    spelled = {names.FIXED, names.FIXED_LARGE, names.RLBOOST, names.ORACLE}
    compared = spelled | {names.PEARL}
    offenders = []
    for package in ("controlplane", "agents", "benchmarks", "pearl_cli", "pearl_site"):
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel == "controlplane/core/policies/names.py" or "/migrations/" in rel:
                continue
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and node.value in spelled:
                    offenders.append(f"{rel}:{node.lineno} spells {node.value!r}")
                elif isinstance(node, ast.Compare):
                    for side in (node.left, *node.comparators):
                        elts = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                        for e in elts:
                            if isinstance(e, ast.Constant) and e.value in compared:
                                offenders.append(f"{rel}:{node.lineno} compares with {e.value!r}")
    assert offenders == []
