"""Thin glue between the simulator and core: policy construction for scenarios and their variants.

The simulator never decides anything itself: policies come from `core.policies.make_policy`,
placement and plans from `core.placement.place`. Scenario *variants* (the ablation's A, A+B,
A+B+C) are a base policy plus `make_policy` options and policy `Overrides` (force_mode,
force_ratio, borrowing) that the simulator puts in every PolicyContext, as a user would.

Ungated borrowing (the ablation's B) is a variant's `gate: false`, PEARL's option `gate=False`, and every
policy gets the scenario's max trajectory length (`max_trajectory_tokens`), which bounds the tracker's K_seq.
A static pool (the policy's `static_pool` trait) is sized from the scenario: the reserved GPUs, or the
trace's mean rounded up to TP (`Scenario.large_pool_gpus`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from controlplane.core.context import Overrides
from controlplane.core.policies import REGISTRY, StaticPool, TrackedPolicy, make_policy


@dataclass(frozen=True, slots=True)
class Variant:
    """A named policy variant: base policy + make_policy options + overrides + gate on/off."""

    base: str
    options: dict[str, Any] = field(default_factory=dict)
    overrides: dict[str, Any] = field(default_factory=dict)
    gate: bool = True


def parse_variant(name: str, spec: Any) -> Variant:
    if isinstance(spec, str):
        return Variant(spec)
    if not isinstance(spec, dict) or "base" not in spec:
        raise ValueError(f"variant {name!r}: give a base policy name or a mapping with 'base'")
    unknown = set(spec) - {"base", "options", "overrides", "gate"}
    if unknown:
        raise ValueError(f"variant {name!r}: unknown keys {sorted(unknown)}")
    ov = dict(spec.get("overrides") or {})
    if "force_ratio" in ov and ov["force_ratio"] is not None:
        ov["force_ratio"] = tuple(ov["force_ratio"])
    Overrides(**ov)  # validate early
    return Variant(str(spec["base"]), dict(spec.get("options") or {}), ov, bool(spec.get("gate", True)))


def resolve_policy(name: str, variants: Mapping[str, Any]) -> Variant:
    if name in variants:
        v = parse_variant(name, variants[name])
    else:
        v = Variant(name)
    if v.base not in REGISTRY:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(tuple(REGISTRY) + tuple(variants))}")
    return v


def make_sim_policy(name: str, scenario: Any, profile: Any) -> tuple[TrackedPolicy, Variant]:
    """Build the core policy for `name` (a base policy or a scenario variant)."""
    v = resolve_policy(name, scenario.variants)
    cls = REGISTRY[v.base]
    cl = scenario.cluster
    opts: dict[str, Any] = dict(scenario.policy_options.get(v.base, {}))
    opts.update(v.options)
    if cls.static_pool is StaticPool.TRACE_MEAN:
        opts.setdefault("workers", scenario.large_pool_gpus // cl.tp)
    elif cls.static_pool is StaticPool.RESERVED:
        opts.setdefault("workers", cl.reserved_gpus // cl.tp)
    opts.setdefault("max_trajectory_tokens", scenario.workload.max_length)
    if not v.gate and any(o.name == "gate" for o in cls.options):
        opts["gate"] = False
    return make_policy(v.base, profile=profile, batch_size=scenario.workload.batch_size, **opts), v
