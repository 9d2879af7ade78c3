"""Mixed pools (issue 23): PEARL's and the best-homogeneous baseline's decisions, and typed placement."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from controlplane.core.context import Overrides, PolicyContext, Signal
from controlplane.core.decision import Candidate, MixedCandidate
from controlplane.core.placement import Inventory, Unit, place, typed_configuration_of
from controlplane.core.policies import make_policy, names
from controlplane.core.policies.pearl import PearlPolicy
from controlplane.core.profiles import get_profile
from controlplane.core.state import Configuration, Mode, Pool, Role

PROFILE = get_profile("H800", "qwen3-8b")


def mixed_ctx(**kw: Any) -> PolicyContext:
    base: dict[str, Any] = dict(
        now_s=0.0,
        signal=Signal.STEP_START,
        dedicated_workers=8,
        reserved_workers=2,
        overlap_workers=0,
        training_active=True,
        current=None,
        borrowed=0,
        batch_size=64,
        remaining=64,
        hardware=(("H20", 4), ("H800", 4)),
        overlap_hardware="",
    )
    base.update(kw)
    return PolicyContext(**base)


def test_one_candidate_type() -> None:
    assert MixedCandidate is Candidate
    c = Candidate.of(Configuration.parse("3P(H800) 5D(H20)"), 60.0, True, 30.0, 50.0, 0.5, 10.0)
    assert c.configuration == Configuration.disaggregated(3, 5, "H800", "H20") and c.label == "3P(H800) 5D(H20)"
    assert c.kind == (Mode.DISAGGREGATED, "H800", "H20")


def test_pearl_on_a_mixed_pool_starts_as_the_baselines_then_may_trial_a_cross_type_split() -> None:
    p = make_policy(names.PEARL, profile=PROFILE, batch_size=64)
    first = p.on_event(mixed_ctx())
    # nothing has run yet: every worker colocated over both types, as RLBoost+ / B-only run
    assert first.target == Configuration.colocated(8, "H20+H800")
    # at a step start with a fitted workload PEARL may enter another kind as a trial; with the prior's
    # estimates unfitted it keeps to what ran, so mid-step it only changes membership
    mid = p.on_event(mixed_ctx(signal=Signal.PERIODIC, current=first.target))
    assert mid.target.mode is Mode.COLOCATED
    forced = p.on_event(mixed_ctx(current=first.target, overrides=Overrides(force_configuration="4P(H800) 4D(H20)")))
    assert forced.target == Configuration.disaggregated(4, 4, "H800", "H20") and forced.decision.overridden


def test_mid_step_pearl_keeps_every_running_chip_type_the_pool_still_has() -> None:
    p = make_policy(names.PEARL, profile=PROFILE, batch_size=64)
    first = p.on_event(mixed_ctx())
    assert first.target == Configuration.colocated(8, "H20+H800")
    # the router homes by chip speed, so all eight are priced balanced: never slower than the four H800 alone
    cands = {c.label: c.makespan_s for c in p.on_event(mixed_ctx(current=None)).decision.candidates}
    assert cands["8C(H20+H800)"] <= cands["4C(H800)"]
    # mid-step a running colocated worker leaves only when the pool takes it: no H20 is dropped
    mid = p.on_event(mixed_ctx(signal=Signal.PERIODIC, current=first.target))
    assert mid.target == Configuration.colocated(8, "H20+H800")
    # the pool taking the H20 away (preemption) is followed
    gone = p.on_event(mixed_ctx(signal=Signal.CAPACITY_CHANGE, current=first.target, hardware=(("H800", 4),)))
    assert gone.target.total == 4 and gone.target.mode is Mode.COLOCATED


def test_best_homogeneous_uses_one_chip_type() -> None:
    p = make_policy(names.BEST_HOMOGENEOUS, profile=PROFILE, batch_size=64)
    a = p.on_event(mixed_ctx())
    cfg = a.target
    assert not cfg.cross_type and "+" not in cfg.prefill_hardware and cfg.prefill_hardware in ("H800", "H20")
    assert cfg.total <= 4


def units() -> list[Unit]:
    out = [Unit(("n0", i), Pool.RESERVED, i, Role.COLOCATED, hardware="H800") for i in range(3)]
    out += [Unit(("n1", i), Pool.ELASTIC, 3 + i, Role.COLOCATED, hardware="H20") for i in range(3)]
    out += [Unit(("n2", 0), Pool.ELASTIC, None, None, hardware="A100")]
    return out


class _Fixed:
    """A policy that answers one target (placement is what is under test)."""

    name = "fixed-target"

    def __init__(self, target: Configuration) -> None:
        self.target = target

    def on_event(self, ctx: PolicyContext) -> Any:
        from controlplane.core.decision import decide_mixed
        from controlplane.core.policies import PolicyAction
        from controlplane.core.predictor import swe_bench_workload
        from controlplane.core.profiles import link_bytes_per_s

        w = swe_bench_workload()
        co = {h: get_profile(h, "qwen3-8b").coefficients() for h, _ in ctx.hardware}
        d = decide_mixed(w, co, dict(ctx.hardware), link_bytes_per_s).as_decision(self.target.total)
        return PolicyAction(self.target, 0, d)

    def observe(self, record: Any) -> None: ...

    def state(self) -> dict[str, Any]:
        return {}

    def load_state(self, state: Any) -> None: ...


def test_typed_placement_puts_each_role_on_its_chip_with_minimal_change() -> None:
    inv = Inventory(tuple(units()))
    assert inv.current() == Configuration.colocated(6, "H20+H800")
    target = Configuration.parse("2P(H800) 3D(H20)")
    p = place(inv, _Fixed(target), signal=Signal.STEP_START, now_s=0.0, batch_size=64, remaining=64)
    assert p.context.hardware == (("A100", 1), ("H20", 3), ("H800", 3))
    assert p.target == target
    hw = {u.worker: u.hardware for u in units() if u.worker is not None}
    result = p.plan.result
    assert {hw[w] for w, r in result.items() if r is Role.PREFILL} == {"H800"}
    assert {hw[w] for w, r in result.items() if r is Role.DECODE} == {"H20"}
    assert sum(1 for r in result.values() if r is Role.PREFILL) == 2 and len(p.plan.remove) == 1  # one H800 leaves
    assert not p.plan.add  # the free A100 is not used
    served = [Unit(w, Pool.RESERVED, w, r, hardware=hw[w]) for w, r in result.items()]
    assert typed_configuration_of(served) == target
    # Eq. 5-6 over both types: one H800 leaves, the other five flip role (2 to prefill, 3 to decode)
    assert (p.plan.d_worker, p.plan.d_role) == (1, 5)
    assert str(p.plan.steps[0].kind) == "stop_worker" and p.plan.steps[0].forced  # removals first


def test_engine_records_name_their_chip_and_reach_that_chips_tracker_before_any_decision() -> None:
    from controlplane.core.telemetry import TelemetryRecord, decode_iteration

    rec = decode_iteration(worker=5, hardware="H20", running_batch=8, duration_s=0.02)
    assert TelemetryRecord.from_json(rec.to_json()) == rec  # the field crosses the wire
    # a live planner rebuilds the policy from stored telemetry at each signal: it replays records before it has
    # seen any pool, so only the record itself can say which chip timed it
    p = make_policy(names.PEARL, profile=PROFILE, batch_size=64)
    for n in range(1, 41):
        p.observe(decode_iteration(worker=5, hardware="h20", running_batch=n, duration_s=0.01 + 1e-3 * n))
    p.observe(decode_iteration(worker=6, hardware="no-such-chip", running_batch=4, duration_s=0.02))  # ignored
    p.on_event(mixed_ctx())
    assert isinstance(p, PearlPolicy) and p.hw_trackers is not None
    h20 = p.hw_trackers.by_type["H20"]
    assert h20._decode.total == 40 and p.hw_trackers.by_type["H800"]._decode.total == 0
    assert h20.coefficients()[0].decode_b == pytest.approx(1e-3, rel=0.05)


def test_a_step_start_prices_each_kind_over_the_steps_borrow_window() -> None:
    from controlplane.core.telemetry import step

    def fitted_pearl() -> Any:
        p = make_policy(names.PEARL, profile=PROFILE, batch_size=64)
        for k in range(3):
            p.observe(
                step(
                    step=k,
                    batch_size=64,
                    turns_max=30,
                    new_prompt_tokens_mean=1200.0,
                    generated_tokens_mean=40.0,
                    env_time_total_s=50.0,
                    active_decode_fraction=0.7,
                )
            )
        return p

    cur = Configuration.colocated(8, "H20+H800")
    # without a borrow window seen, the dedicated pool alone decides: the cross-type split
    alone = fitted_pearl()
    alone.on_event(mixed_ctx(current=cur))
    assert alone.on_event(mixed_ctx(current=cur)).target == Configuration.disaggregated(4, 4, "H800", "H20")
    # the trainer took 100 s last time and lent 8 H800 workers; this step starts 10 s before Training Finished, so
    # most of it runs with them, which the split (its 4 H20 decode workers the bottleneck) cannot use
    p = fitted_pearl()
    p.on_event(mixed_ctx(current=cur))
    p.on_event(mixed_ctx(signal=Signal.TRAINING_BEGIN, now_s=0.0, current=cur))
    lent = mixed_ctx(
        signal=Signal.TRAINING_FINISHED, now_s=100.0, training_active=False, overlap_workers=8, overlap_hardware="H800"
    )
    assert p.on_event(replace(lent, current=cur)).borrow == 8
    p.on_event(mixed_ctx(signal=Signal.TRAINING_BEGIN, now_s=200.0, current=cur))
    a = p.on_event(mixed_ctx(signal=Signal.STEP_START, now_s=290.0, current=cur))
    assert a.target.mode is Mode.COLOCATED and "borrow window" in a.decision.inputs["step_kind"]
    # the window is part of the policy's state (a live planner rebuilds the policy from it at every signal)
    q = make_policy(names.PEARL, profile=PROFILE, batch_size=64)
    q.load_state(p.state())
    assert isinstance(q, PearlPolicy) and q._window == (100.0, "H800", 8) and q._tb_s == 200.0
