"""RLBoost+ (core.policies.RLBoostPolicy, built by the simulator as `rlboost+`): RLBoost's Algorithm 1."""

from __future__ import annotations

from controlplane.core import telemetry as tm
from controlplane.core.context import PolicyContext, Signal
from controlplane.core.policies import RLBoostPolicy
from controlplane.core.profiles import get_profile
from controlplane.sim.adapters import resolve_policy
from controlplane.sim.cluster import Simulation

PROFILE = get_profile("h800", "qwen3-8b", tp=2)


def _ctx(signal: Signal, now: float, *, dedicated: int = 6, borrowed: int = 0, training: bool = False):
    return PolicyContext(
        now_s=now,
        signal=signal,
        dedicated_workers=dedicated,
        reserved_workers=2,
        overlap_workers=0 if training else 8,
        training_active=training,
        current=None,
        borrowed=borrowed,
        batch_size=64,
        remaining=64,
    )


def test_seeding_window_follows_the_eta_rule_with_the_floor():
    pol = RLBoostPolicy(profile=PROFILE, batch_size=64, t_seed_s=100.0)
    pol.on_event(_ctx(Signal.TRAINING_FINISHED, 0.0))
    assert pol.last_action.borrow == 8  # seeding window open
    pol.on_event(_ctx(Signal.PERIODIC, 100.0, borrowed=8))  # window over: seeding stops
    assert pol.last_action.borrow == 0
    pol.on_event(_ctx(Signal.TRAINING_BEGIN, 160.0, training=True))
    # the trainer waited 60 s after seeding stopped, nothing was borrowed at Training Begin: T += 60/3
    assert abs(pol.t_seed_s - 120.0) < 1e-9
    pol.t_seed_s = 6.0
    pol.on_event(_ctx(Signal.TRAINING_FINISHED, 200.0))
    pol.on_event(_ctx(Signal.TRAINING_BEGIN, 203.0, training=True, borrowed=8))  # seeding ran into TB
    assert pol.t_seed_s == RLBoostPolicy.FLOOR_S


def test_memo_records_the_best_window_per_instance_count():
    pol = RLBoostPolicy(profile=PROFILE, batch_size=64, t_seed_s=100.0)
    pol.on_event(_ctx(Signal.TRAINING_FINISHED, 0.0))
    for k, (seed, thr) in enumerate([(100.0, 1000.0), (120.0, 1200.0), (140.0, 900.0)]):
        pol.t_seed_s = seed
        pol.observe(tm.step(step=k, makespan_s=300.0, generated_tokens_total=int(thr * 100), train_tokens=0))
        pol.observe(tm.train(step=k, time_s=100.0 * (k + 1), duration_s=50.0))
    # throughput fell at T=140: the memo keeps mostly the peak window (α = 0.8 on the peak 120)
    assert 118.0 <= pol.memo[6] <= 120.0


def test_remote_cap_uses_just_enough_instances():
    pol = RLBoostPolicy(profile=PROFILE, batch_size=64, t_seed_s=10.0)
    pol.observe(tm.step(step=0, makespan_s=100.0, generated_tokens_total=1, train_tokens=1))
    pol.observe(tm.train(step=0, time_s=10.0, duration_s=400.0))  # training is 4x the rollout
    assert pol._dedicated(_ctx(Signal.CAPACITY_CHANGE, 0.0, dedicated=6)) == 2  # ⌈(100·6 + 10·8)/400⌉ = 2
    uncapped = RLBoostPolicy(profile=PROFILE, batch_size=64, cap=False)
    assert uncapped._dedicated(_ctx(Signal.CAPACITY_CHANGE, 0.0, dedicated=6)) == 6


def test_the_simulator_runs_it_by_name(small):
    assert resolve_policy("rlboost+", {}).base == "rlboost+"
    r = Simulation(small, "rlboost+").run()
    assert r.steps > 0 and r.lost_tokens == 0 and r.return_deadline_misses == 0


def test_the_simulator_dispatches_its_turns_by_algorithm_2(small):
    """RLBoost+ routes by join-shortest-queue with delayed dispatch at the plateau batch; every other
    policy keeps PEARL's sticky router."""
    from controlplane.core.profiles import plateau_batch

    sim = Simulation(small, "rlboost+")
    ctx = small.workload.max_length / 2
    assert sim.loop.cfg.dispatch == "jsq"
    assert sim.loop.cfg.dispatch_cap == plateau_batch(sim.profile.coefficients(mean_context=ctx), ctx) > 1
    assert Simulation(small, "pearl").loop.cfg.dispatch == "sticky"
