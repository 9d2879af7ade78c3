"""Parity: one inventory and one sequence of signals, fed to the simulator's scheduler and to the live
services (real database), give the same decisions, placements and transition plans, step by step."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from controlplane.core.context import Signal
from controlplane.models import Decision, Node, Transition
from controlplane.services import draining, jobs, planner
from controlplane.sim.cluster import Simulation
from controlplane.sim.scenario import scenario_from_dict
from tests.support.cluster import make_job, make_node, run_transition

pytestmark = pytest.mark.django_db

# t, signal, R, what happens to the cluster just before the signal
SEQUENCE = [
    (0.0, Signal.STEP_START, 64, None),  # training GPUs idle: they may be borrowed
    (20.0, Signal.PERIODIC, 60, None),
    (45.0, Signal.CAPACITY_CHANGE, 41, "lose c"),  # preemptible node c is taken away (2 units)
    (150.0, Signal.PERIODIC, 12, None),
    (200.0, Signal.CAPACITY_CHANGE, 9, "gain d"),  # a new preemptible node d joins (2 units)
    (260.0, Signal.TRAINING_BEGIN, 0, None),  # borrowed workers go back
    (262.0, Signal.STEP_START, 64, None),
    (400.0, Signal.TRAINING_FINISHED, 50, None),
    (520.0, Signal.PERIODIC, 20, None),
    (600.0, Signal.TRAINING_BEGIN, 0, None),
    (601.0, Signal.STEP_START, 64, None),
]


# A P:D ratio override (scaled to the budget): the plans then flip roles between prefill and decode as the
# budget moves, through the simulator's and the live planner's paths alike.
PD_RATIO = {"force_mode": "disaggregated", "force_n_prefill": 1, "force_n_decode": 2}


def _scenario(policy: str, options: dict, overrides: dict | None = None):
    variant = {}
    if overrides:
        ratio = [overrides["force_n_prefill"], overrides["force_n_decode"]]
        variant = {"variants": {"forced": {"base": policy, "overrides": {"force_ratio": ratio}}}}
    return scenario_from_dict(
        {
            "name": "parity",
            "model": "qwen3-8b",
            "cluster": {"training_gpus": 4, "reserved_gpus": 4, "preemptible_gpus": 8, "hardware": "H800", "tp": 2},
            "workload": {"batch_size": 64, "group_size": 16},
            "trace": {"constant_gpus": 12},
            "duration_s": 10_000,
            "policies": ["forced" if overrides else policy],
            "policy_options": {policy: options},
            **variant,
        }
    )


def _plan_view(add, remove, reassign) -> dict:
    return {
        "add": {int(k): str(v) for k, v in add.items()},
        "remove": sorted(int(x) for x in remove),
        "reassign": {int(k): str(v) for k, v in reassign.items()},
    }


def _run_sim(policy: str, options: dict, overrides: dict | None = None) -> list[dict]:
    sim = Simulation(_scenario(policy, options, overrides), "forced" if overrides else policy)
    sim.setup()
    w = sim.world
    out: list[dict[str, Any]] = []
    for t, signal, remaining, change in SEQUENCE:
        sim.advance(t)
        if change == "lose c":
            for slot in [s for s in w.slots.values() if s.pool == "elastic"][2:4]:
                w.preempt(slot, t)
        elif change == "gain d":
            w.new_unit("elastic", "idle")
            w.new_unit("elastic", "idle")
        p = sim.signal(signal, remaining)
        row = {
            "signal": str(signal),
            "target": p.target.label(),
            "borrow": p.borrow,
            "budget": p.budget,
            "reason": p.action.decision.reason,
            "plan": _plan_view(p.plan.add, p.plan.remove, p.plan.reassign) if not p.plan.empty else None,
        }
        if (
            signal is Signal.PERIODIC
            and out
            and row["plan"] is None
            and p.target == p.current
            and all(row[k] == out[-1][k] for k in ("target", "borrow", "budget"))
        ):
            row["reason"] = "no-op"  # the live planner records no row for a periodic re-plan that changes nothing
        out.append(row)
    return out


def _run_live(policy: str, options: dict, overrides: dict | None = None) -> list[dict]:
    make_node("a-res", slots=4, hardware="H800")
    make_node("b-ela", pool="elastic", slots=4, hardware="H800")
    c = make_node("c-ela", pool="elastic", slots=4, hardware="H800")
    make_node("t-train", pool="training", slots=4, hardware="H800")
    job = make_job(
        "parity",
        model="qwen3-8b",
        hardware="h800",
        tp=2,
        batch_size=64,
        group_size=16,
        rollout_gpus=12,
        training_gpus=4,
        policy=policy,
        policy_options=options,
    )
    if overrides:
        jobs.set_overrides(job_id=job.pk, changes=overrides, actor="test")
    out: list[dict[str, Any]] = []
    for t, signal, remaining, change in SEQUENCE:
        if change == "lose c":
            draining.preemption_notice(node_id=c.pk, deadline=timezone.now() + timedelta(seconds=1), actor="test")
            draining.remove_preempted(now=timezone.now() + timedelta(seconds=2))
        elif change == "gain d":
            make_node("d-ela", pool="elastic", slots=4, hardware="H800")
        if signal in (Signal.TRAINING_BEGIN, Signal.TRAINING_FINISHED):
            jobs.set_training_active(job_id=job.pk, active=signal is Signal.TRAINING_BEGIN)
        type(job).objects.filter(pk=job.pk).update(remaining=remaining)
        before = Decision.objects.filter(job=job).count()
        tr = planner.plan_job(job_id=job.pk, signal=signal, now_s=t)
        d = Decision.objects.filter(job=job).first()
        if Decision.objects.filter(job=job).count() == before:
            assert signal is Signal.PERIODIC and tr is None
            out.append({**out[-1], "signal": str(signal), "reason": "no-op", "plan": None})
            continue
        plan = None
        if tr is not None:
            plan = _plan_view(tr.plan["add"], tr.plan["remove"], tr.plan["reassign"])
            assert run_transition(tr).status == Transition.Status.SUCCEEDED
        label = f"{d.n_colocated}C" if d.mode == "colocated" else f"{d.n_prefill}P{d.n_decode}D"
        out.append(
            {
                "signal": str(signal),
                "target": label,
                "borrow": d.borrow,
                "budget": d.budget,
                "reason": d.reason,
                "plan": plan,
            }
        )
    assert Node.objects.get(name="c-ela").status == "gone"
    return out


@pytest.mark.parametrize(
    "policy,options,overrides",
    [
        ("pearl", {}, None),  # starts colocated (no mode run yet) and the gate keeps it from borrowing here
        ("pearl", {"mode_trial": False}, PD_RATIO),  # disaggregated at a forced ratio: ratio changes and role flips
        ("pearl", {"gate": False}, None),
        ("elastic", {"t_seed_s": 200.0}, None),
        ("fixed", {"workers": 3}, None),
    ],
)
def test_simulator_and_live_planner_decide_and_plan_alike(policy, options, overrides):
    sim = _run_sim(policy, options, overrides)
    live = _run_live(policy, options, overrides)
    for i, (s, lv) in enumerate(zip(sim, live)):
        assert s == lv, f"step {i} ({SEQUENCE[i][1]}): simulator {s} != live {lv}"
    assert len(sim) == len(live) == len(SEQUENCE)
    # the sequence really moved things: workers joined, left, were borrowed and returned (Training Begin
    # returns them before its plan, which records how many it took back)
    plans = [x["plan"] for x in sim if x["plan"]]
    returned = any(x["signal"] == str(Signal.TRAINING_BEGIN) and x["budget"]["borrowed"] for x in sim)
    resized = len({x["target"] for x in sim}) > 1  # the budget moved the configuration (4C <-> 6C at least)
    assert (
        any(p["add"] for p in plans) and (returned or resized or any(p["remove"] or p["reassign"] for p in plans))
    ) or policy == "fixed"
    if overrides:
        assert any(p["reassign"] for p in plans)  # role flips between prefill and decode went through both paths
