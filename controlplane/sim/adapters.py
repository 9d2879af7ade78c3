"""Thin glue between the simulator and core: policy construction and transition plans.

The simulator never decides anything itself: policies come from `core.policies.make_policy` and
role maps from `core.transitions.plan_transition`. Scenario *variants* (the ablation's A, A+B,
A+B+C) are a base policy plus `make_policy` options and policy `Overrides` (force_mode,
force_ratio, borrowing) that the simulator puts in every PolicyContext, as a user would.

ADAPTER (core gap): core's PearlPolicy has no switch for *ungated* borrowing (ablation "B": borrow
every idle overlap worker without Eq. 7). `UngatedPearl` below subclasses it and only replaces
the gate's verdict with "admit"; everything else (decision, tracker) is core's.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from controlplane.core.borrowing import gate
from controlplane.core.policies import Overrides, PearlPolicy, make_policy
from controlplane.core.state import Configuration, Role
from controlplane.core.tracker import RuntimeTracker
from controlplane.core.transitions import TransitionPlan, plan_transition

BASE_POLICIES = ("pearl", "fixed", "fixed-large", "elastic", "oracle")


@dataclass(frozen=True, slots=True)
class Variant:
    """A named policy variant: base policy + make_policy options + overrides + gate on/off."""

    base: str
    options: dict[str, Any] = field(default_factory=dict)
    overrides: dict[str, Any] = field(default_factory=dict)
    gate: bool = True
    kv_cap: bool = False  # what-if only: cap the tracker's K_seq at the max trajectory length


class CappedKvTracker(RuntimeTracker):
    """WHAT-IF ADAPTER (report only, not the PEARL result): core's tracker derives the peak KV of a
    trajectory as prompt + S·(ΔL + r) with S the turns of the slowest trajectory, which exceeds the
    max trajectory length when trajectories are length-capped, so the predictor declares feasible
    configurations infeasible. This subclass caps K_seq (and the contexts scaled from it) at the
    max length, to measure how much that costs PEARL. Passed through core's `tracker=` option."""

    def __init__(self, *args: Any, max_length: int, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.max_length = max_length

    def workload(self):  # type: ignore[no-untyped-def]
        from dataclasses import replace

        w, est = super().workload()
        if w.kv_seq_tokens > self.max_length > 0:
            k = self.max_length / w.kv_seq_tokens
            w = replace(w, kv_seq_tokens=float(self.max_length), mean_context=w.mean_context * k,
                        prefix_tokens=w.prefix_tokens * k)
        return w, est


class UngatedPearl(PearlPolicy):
    """ADAPTER: PEARL with the Eq. 7 gate always admitting (ablation component B without C)."""

    name = "pearl-ungated"

    def _gate(self, w, c, ctx, n_ded, n_full):  # type: ignore[no-untyped-def]
        return gate(remaining=1, batch_size=1, t_dedicated_s=1.0, t_full_s=0.0, toggle_s=0.0)


def parse_variant(name: str, spec: Any) -> Variant:
    if isinstance(spec, str):
        return Variant(spec)
    if not isinstance(spec, dict) or "base" not in spec:
        raise ValueError(f"variant {name!r}: give a base policy name or a mapping with 'base'")
    unknown = set(spec) - {"base", "options", "overrides", "gate", "kv_cap"}
    if unknown:
        raise ValueError(f"variant {name!r}: unknown keys {sorted(unknown)}")
    ov = dict(spec.get("overrides") or {})
    if "force_ratio" in ov and ov["force_ratio"] is not None:
        ov["force_ratio"] = tuple(ov["force_ratio"])
    Overrides(**ov)  # validate early
    return Variant(str(spec["base"]), dict(spec.get("options") or {}), ov, bool(spec.get("gate", True)),
                   bool(spec.get("kv_cap", False)))


def resolve_policy(name: str, variants: Mapping[str, Any]) -> Variant:
    if name in variants:
        v = parse_variant(name, variants[name])
    else:
        v = Variant(name)
    if v.base not in BASE_POLICIES:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(BASE_POLICIES + tuple(variants))}")
    return v


def make_sim_policy(name: str, scenario: Any, profile: Any) -> tuple[Any, Variant]:
    """Build the core policy for `name` (a base policy or a scenario variant)."""
    v = resolve_policy(name, scenario.variants)
    cl = scenario.cluster
    opts: dict[str, Any] = dict(scenario.policy_options.get(v.base, {}))
    opts.update(v.options)
    if v.base == "fixed-large":
        opts.setdefault("workers", scenario.large_pool_gpus // cl.tp)
    if v.base == "fixed":
        opts.setdefault("workers", cl.reserved_gpus // cl.tp)
    if v.kv_cap:
        opts["tracker"] = CappedKvTracker(profile, batch_size=scenario.workload.batch_size,
                                          max_length=scenario.workload.max_length)
    if v.base == "pearl" and not v.gate:
        return UngatedPearl(profile=profile, batch_size=scenario.workload.batch_size, **opts), v
    return make_policy(v.base, profile=profile, batch_size=scenario.workload.batch_size, **opts), v


def plan_roles(current: Mapping[int, Role], target: Configuration, *, joining: list[int], leaving: list[int],
               inflight: Mapping[int, int], overlap: list[int] = ()) -> TransitionPlan:
    """core `plan_transition` over the simulator's slots."""
    counts = {r: n for r, n in target.role_counts().items() if n > 0}
    return plan_transition(current, counts, joining=joining, leaving=leaving, inflight=inflight, overlap=overlap)
