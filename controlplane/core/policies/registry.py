"""The one registry of policies: name -> class, the views every caller reads, and construction with validated
options. The live control plane, the simulator, the catalog (API, job form, CLI), the reports and the docs
read it; what a policy does is in its traits (`base.TrackedPolicy`), its name is in `names`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from controlplane.core.policies.base import OptionError, TrackedPolicy
from controlplane.core.policies.baselines import ElasticPolicy, FixedLargePolicy, FixedPolicy, RLBoostPolicy
from controlplane.core.policies.names import ALIASES
from controlplane.core.policies.oracle import OraclePolicy
from controlplane.core.policies.pearl import BestHomogeneousPolicy, PearlPolicy
from controlplane.core.predictor import WorkloadProfile
from controlplane.core.profiles import Profile
from controlplane.core.tracker import RuntimeTracker

REGISTRY: dict[str, type[TrackedPolicy]] = {
    cls.name: cls
    for cls in (
        PearlPolicy,
        FixedPolicy,
        FixedLargePolicy,
        RLBoostPolicy,
        ElasticPolicy,
        BestHomogeneousPolicy,
        OraclePolicy,
    )
}
"""Every policy, in the order of the simulator's reports."""
POLICIES: dict[str, type[TrackedPolicy]] = {n: c for n, c in REGISTRY.items() if c.listed}
"""The catalog (API, job form, CLI) and a scenario's default policies."""
POLICY_ALIASES: dict[str, str] = ALIASES
POLICY_NAMES: tuple[str, ...] = tuple(POLICIES)
PRODUCT_POLICIES: tuple[str, ...] = tuple(n for n, c in POLICIES.items() if c.product)


def policy_class(name: str) -> type[TrackedPolicy]:
    key = str(name).strip().lower()
    cls = REGISTRY.get(POLICY_ALIASES.get(key, key))
    if cls is None:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(REGISTRY)}")
    return cls


def validate_options(name: str, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The user-settable options of policy `name`, parsed strictly (OptionError names the option)."""
    cls = policy_class(name)
    specs = {o.name: o for o in cls.options}
    out: dict[str, Any] = {}
    for key, value in (options or {}).items():
        spec = specs.get(key)
        if spec is None:
            raise OptionError(
                str(key), f"{key!r} is not an option of policy {cls.name!r} (its options: {', '.join(specs) or 'none'})"
            )
        out[key] = spec.parse(value)
    cls.check_options(out)
    return out


def make_policy(
    name: str,
    *,
    profile: Profile,
    batch_size: int,
    workload: WorkloadProfile | None = None,
    tracker: RuntimeTracker | None = None,
    max_trajectory_tokens: int | None = None,
    **options: Any,
) -> TrackedPolicy:
    """Build a policy by name (or alias) with its validated options (see `REGISTRY[name].options`)."""
    cls = policy_class(name)
    return cls(
        profile=profile,
        batch_size=batch_size,
        workload=workload,
        tracker=tracker,
        max_trajectory_tokens=max_trajectory_tokens,
        **validate_options(name, options),
    )
