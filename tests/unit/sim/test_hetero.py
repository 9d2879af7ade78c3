"""Issue 23 (b): a rollout pool of one chip beside a trainer of another (H20 rollout GPUs, H800 trainer)."""

from __future__ import annotations

from dataclasses import replace

from controlplane.core.policies import names
from controlplane.sim.cluster import Simulation
from controlplane.sim.scenario import get_scenario


def test_training_hardware_times_the_trainer_and_the_overlap_engines() -> None:
    sc = get_scenario("hetero-qwen3-8b-seg1-h20")
    assert (sc.cluster.hardware, sc.cluster.training_hardware) == ("H20", "H800")
    sim = Simulation(sc, names.PEARL)
    assert sim.profile.hardware == "H20" and sim.train_profile.hardware == "H800"
    assert sim.train_profile.train_step_s(1e6, 16) < sim.profile.train_step_s(1e6, 16) / 5  # H800 trains ~6.7×
    # an overlap unit (training GPUs) runs its engine on the H800, a dedicated one on the H20
    ovl = sim.world.new_unit("overlap", "inactive")
    ded = sim.world.new_unit("elastic", "idle")
    assert ovl.worker.costs is sim.overlap_costs and ded.worker.costs is sim.costs
    assert ovl.worker.costs.prefill_s(2048, 0) < ded.worker.costs.prefill_s(2048, 0) / 3  # compute-bound
    # without training_hardware, one chip for both, as before
    same = Simulation(replace(sc, cluster=replace(sc.cluster, training_hardware="")), names.PEARL)
    assert same.train_profile is same.profile and same.overlap_costs is same.costs
