"""Ablation variants reach core's policy as overrides/options, and the executor honours them."""

from __future__ import annotations

import pytest

from controlplane.core.policies.pearl import PearlPolicy
from controlplane.sim.adapters import make_sim_policy, parse_variant, resolve_policy
from controlplane.sim.cluster import run_policy
from controlplane.sim.scenario import ScenarioError, scenario_from_dict

from .conftest import SMALL


def _scenario(**variants):
    data = dict(
        SMALL,
        name="variants",
        trace={"constant_gpus": 4},
        cluster=dict(SMALL["cluster"], reserved_gpus=4, preemptible_gpus=0),
        duration_s=900,
    )
    data["variants"] = variants
    return scenario_from_dict(data)


def test_borrowing_off_never_borrows_and_forced_disaggregation_is_applied():
    sc = _scenario(
        A={"base": "pearl", "overrides": {"borrowing": False, "force_mode": "disaggregated"}},
        AB={"base": "pearl", "gate": False, "overrides": {"force_mode": "disaggregated"}},
    )
    a = run_policy(sc, "A")
    assert a.borrowed_gpu_s == 0.0
    assert all("P" in s.config_label for s in a.step_stats)  # 1P1D on 2 workers
    ab = run_policy(sc, "AB")
    assert ab.borrowed_gpu_s > 0.0


def test_ungated_variant_uses_cores_gate_switch_and_names_are_checked():
    from controlplane.core.profiles import get_profile

    sc = _scenario(AB={"base": "pearl", "gate": False})
    policy, variant = make_sim_policy("AB", sc, get_profile(sc.cluster.hardware, sc.model, tp=sc.cluster.tp))
    assert isinstance(policy, PearlPolicy)
    assert variant.base == "pearl" and policy.gated is False
    assert policy.tracker.max_trajectory_tokens == sc.workload.max_length
    assert resolve_policy("pearl", {}).base == "pearl"
    with pytest.raises(ValueError):
        resolve_policy("nope", {})
    with pytest.raises(ValueError):
        parse_variant("x", {"base": "pearl", "colour": "red"})
    with pytest.raises(ScenarioError):
        scenario_from_dict(dict(SMALL, trace={"constant_gpus": 40}))  # above reserved + preemptible
