"""The one registry of policies: name -> class, the names a job may run, and construction with validated
options. The live control plane, the simulator, the catalog (API, job form, CLI) and the docs read it."""
from __future__ import annotations

from typing import Any, Mapping

from controlplane.core.policies.base import OptionError, Policy, TrackedPolicy
from controlplane.core.policies.baselines import ElasticPolicy, FixedLargePolicy, FixedPolicy
from controlplane.core.policies.oracle import OraclePolicy
from controlplane.core.policies.pearl import PearlPolicy
from controlplane.core.predictor import WorkloadProfile
from controlplane.core.profiles import Profile
from controlplane.core.tracker import RuntimeTracker

POLICIES: dict[str, type[TrackedPolicy]] = {
    cls.name: cls for cls in (PearlPolicy, FixedPolicy, FixedLargePolicy, ElasticPolicy, OraclePolicy)
}
POLICY_ALIASES: dict[str, str] = {"roll": "fixed", "roll-large": "fixed-large", "rlboost+": "elastic"}
POLICY_NAMES: tuple[str, ...] = tuple(POLICIES)
PRODUCT_POLICIES: tuple[str, ...] = tuple(n for n, c in POLICIES.items() if c.product)


def policy_class(name: str) -> type[TrackedPolicy]:
    key = str(name).strip().lower()
    cls = POLICIES.get(POLICY_ALIASES.get(key, key))
    if cls is None:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICY_NAMES)}")
    return cls


def validate_options(name: str, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The user-settable options of policy `name`, parsed strictly (OptionError names the option)."""
    cls = policy_class(name)
    specs = {o.name: o for o in cls.options}
    out: dict[str, Any] = {}
    for key, value in (options or {}).items():
        spec = specs.get(key)
        if spec is None:
            raise OptionError(str(key), f"{key!r} is not an option of policy {cls.name!r} "
                                        f"(its options: {', '.join(specs) or 'none'})")
        out[key] = spec.parse(value)
    if cls is FixedLargePolicy and out.get("workers") is None and out.get("trace_mean_gpus") is None:
        raise OptionError("workers", "fixed-large needs its pool size: the option workers (or trace_mean_gpus)")
    return out


def make_policy(name: str, *, profile: Profile, batch_size: int, workload: WorkloadProfile | None = None,
                tracker: RuntimeTracker | None = None, max_trajectory_tokens: int | None = None,
                **options: Any) -> Policy:
    """Build a policy by name (or alias) with its validated options (see `POLICIES[name].options`)."""
    cls = policy_class(name)
    return cls(profile=profile, batch_size=batch_size, workload=workload, tracker=tracker,
               max_trajectory_tokens=max_trajectory_tokens, **validate_options(name, options))
