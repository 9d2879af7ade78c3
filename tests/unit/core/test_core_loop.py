"""The core loop the live control plane and the simulator both run: budget -> decide -> plan, and
the rule that the core never imports Django."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path
from typing import Any

from controlplane.core.context import PolicyContext, Signal
from controlplane.core.policies import make_policy
from controlplane.core.predictor import swe_bench_workload
from controlplane.core.profiles import get_profile
from controlplane.core.state import Configuration, Mode, Role
from controlplane.core.transitions import plan_transition

CORE = Path(__file__).resolve().parents[3] / "controlplane" / "core"


def test_core_never_imports_django() -> None:
    offenders = []
    for f in sorted(CORE.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mods = [node.module or ""]
            else:
                continue
            if any(m == "django" or m.startswith(("django.", "rest_framework", "channels", "celery")) for m in mods):
                offenders.append(f.name)
    assert offenders == []


def _apply(roles: dict[int, Role], target: Configuration, *, leaving=(), joining=(), overlap=()) -> dict[int, Role]:
    plan = plan_transition(
        roles, {r: n for r, n in target.role_counts().items() if n}, leaving=leaving, joining=joining, overlap=overlap
    )
    res = plan.result
    assert sum(1 for v in res.values() if v is Role.COLOCATED) == target.n_colocated
    assert sum(1 for v in res.values() if v is Role.PREFILL) == target.n_prefill
    assert sum(1 for v in res.values() if v is Role.DECODE) == target.n_decode
    assert not set(res) & set(leaving)
    return res


def test_a_training_step_borrows_returns_and_follows_preemption() -> None:
    # mode_trial off and the Table 2 operating point as the prior (PROFILES.md §5): the unfitted closed form
    # picks disaggregation at once, so the plan walks both modes
    table2 = replace(swe_bench_workload(64, prompt_to_generated=20.0), overhead_s=0.15)
    pearl = make_policy(
        "pearl", profile=get_profile("H800", "qwen3-8b"), batch_size=64, workload=table2, mode_trial=False
    )
    base: dict[str, Any] = dict(reserved_workers=2, batch_size=64, training_active=False)
    dedicated = list(range(5))  # slots 0-4 dedicated (reserved + preemptible), 100-107 overlap
    overlap = list(range(100, 108))

    a = pearl.on_event(
        PolicyContext(
            now_s=0,
            signal=Signal.STEP_START,
            dedicated_workers=5,
            overlap_workers=0,
            current=None,
            borrowed=0,
            remaining=64,
            **base,
        )
    )
    assert a.borrow == 0 and a.target == Configuration.disaggregated(2, 3)
    roles = _apply({}, a.target, joining=dedicated)
    assert set(roles) == set(dedicated)

    b = pearl.on_event(
        PolicyContext(
            now_s=5,
            signal=Signal.TRAINING_FINISHED,
            dedicated_workers=5,
            overlap_workers=8,
            current=a.target,
            borrowed=0,
            remaining=60,
            **base,
        )
    )
    assert b.borrow == 8 and b.target.total == 13 and b.target.mode is Mode.DISAGGREGATED
    roles = _apply(roles, b.target, joining=overlap, overlap=overlap)
    assert set(roles) == set(dedicated) | set(overlap)  # dedicated slots never renumbered

    c = pearl.on_event(
        PolicyContext(
            now_s=40,
            signal=Signal.TRAINING_BEGIN,
            dedicated_workers=5,
            overlap_workers=8,
            current=b.target,
            borrowed=8,
            remaining=0,
            **base,
        )
    )
    assert c.borrow == 0 and c.target.total == 5
    plan = plan_transition(
        roles, {r: n for r, n in c.target.role_counts().items() if n}, leaving=overlap, overlap=overlap
    )
    assert plan.steps[0].kind == "deactivate_overlap" and set(plan.remove) == set(overlap)
    roles = plan.result

    d = pearl.on_event(
        PolicyContext(
            now_s=60,
            signal=Signal.CAPACITY_CHANGE,
            dedicated_workers=4,
            overlap_workers=0,
            current=c.target,
            borrowed=0,
            remaining=64,
            **{**base, "training_active": True},
        )
    )
    assert d.target.total == 4 and d.decision.forced
    roles = _apply(roles, d.target, leaving=[4])
    assert 4 not in roles and set(roles) == {0, 1, 2, 3}
