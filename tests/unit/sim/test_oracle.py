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
