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


def test_mixed_elastic_pool_units_carry_their_chip_costs_and_links() -> None:
    """Issue 23 (c): the k-th elastic unit is H20, H800, A100 in turn; each engine is timed by its own chip, a KV
    hand-off crosses the link joining the two types, and the policies see typed units."""
    from controlplane.core.profiles import link_bytes_per_s
    from controlplane.core.state import Role

    sc = get_scenario("hetero-qwen3-8b-seg1-mixed")
    assert sc.cluster.mixed and sc.cluster.chips == ("A100", "H20", "H800")
    sim = Simulation(sc, names.PEARL)
    w = sim.world
    el = [w.new_unit("elastic", "idle") for _ in range(4)]
    assert [s.hardware for s in el] == ["H20", "H800", "A100", "H20"]
    assert el[0].worker.costs is sim.costs_for("H20") and el[2].worker.costs is sim.costs_for("A100")
    assert el[1].worker.costs.prefill_s(2048, 0) < el[0].worker.costs.prefill_s(2048, 0) / 3
    assert el[0].worker.kv_capacity > el[2].worker.kv_capacity  # 96 GB vs 80 GB per GPU
    el[2].role, el[2].state = Role.DECODE, "serving"
    assert w.link_bw(el[1]) == link_bytes_per_s("H800", "A100", sc.cluster.tp)  # the slower end (A100's NIC)
    inv = w.inventory(False)
    assert {u.hardware for u in inv.units if u.key in {s.sid for s in el}} == {"H20", "H800", "A100"}
    # a scenario of one chip type keeps untyped units (every homogeneous figure is unchanged)
    homo = Simulation(get_scenario("paper-qwen3-8b-seg1"), names.PEARL)
    assert not homo.world.mixed and all(u.hardware == "" for u in homo.world.inventory(False).units)
