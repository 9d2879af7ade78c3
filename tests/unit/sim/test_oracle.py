"""The oracle chooses by simulated outcome (sim/oracle.py): forks of the whole simulation, one per
candidate, each run to the end of the step in flight. It must be an upper bound on PEARL."""

from __future__ import annotations

from controlplane.core.context import Signal
from controlplane.sim.cluster import Simulation
from controlplane.sim.oracle import _fork, candidates


def test_oracle_forks_and_is_not_below_pearl(small):
    oracle = Simulation(small, "oracle")
    o = oracle.run()
    p = Simulation(small, "pearl").run()
    assert oracle.oracle_forks > 0
    assert o.lost_tokens == 0 and o.return_deadline_misses == 0
    assert o.throughput_tok_s >= p.throughput_tok_s


def test_a_fork_leaves_the_parent_untouched(small):
    sim = Simulation(small, "oracle")
    sim.setup()
    from controlplane.core import loop as lp

    sim.feed(lp.Start(0.0))
    sim.advance(200.0)
    before = (sim.t, len(sim.heap), sim.events, sim.world.traj_generated, sim.loop.remaining)
    cands = candidates(sim, Signal.CAPACITY_CHANGE)
    assert any(c.force_mode == "colocated" for c in cands) and any(c.force_ratio for c in cands)
    f = _fork(sim)
    f.advance(600.0)
    assert f.world.traj_generated > sim.world.traj_generated
    assert (sim.t, len(sim.heap), sim.events, sim.world.traj_generated, sim.loop.remaining) == before


def test_the_simulator_runs_the_one_oracle_policy_and_reads_its_traits(small):
    from controlplane.core.policies import OraclePolicy, StaticPool

    sim = Simulation(small, "oracle")
    assert type(sim.policy) is OraclePolicy and sim.free and sim.fork_oracle  # not replaced by another policy
    assert sim.observe == sim.policy.observe
    large = Simulation(small, "fixed-large")
    assert large.policy.static_pool is StaticPool.TRACE_MEAN and large.trace.gpus == (small.large_pool_gpus,)
    assert large.loop.cfg.periodic_s is None and not large.free
    assert Simulation(small, "rlboost+").loop.cfg.dispatch == "jsq"
    assert Simulation(small, "elastic").loop.cfg.dispatch == "sticky"
