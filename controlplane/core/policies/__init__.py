"""Rollout scheduling policies behind one interface and one registry, used unchanged by the live
control plane and the simulator (`sim`).

    policy = make_policy(names.PEARL, profile=..., batch_size=..., **options)  # options checked (OptionSpecs)
    action = policy.on_event(ctx)          # on every elastic signal / budget change
    policy.observe(record)                 # feed a TelemetryRecord (runtime tracker input)

`PolicyContext` (core.context) describes the world at an elastic signal; `PolicyAction` is what the
policy wants: a target Configuration over the workers it will use (dedicated + borrowed overlap
workers), how many overlap (training-GPU) workers to borrow, and the Decision that explains it.

`REGISTRY` (registry.py) is the one table of policies: name, what each is, whether a user may run it as a
product policy, whether the catalog lists it, its options (name, type, default, bounds) and its traits
(static pool, dispatch rule, free reconfiguration, chosen by simulation, report colour). The API, the job
form, the CLI, the simulator, its scenarios and reports and the docs all read it; a policy's name is
spelled only in `names`, and no caller compares names to choose behaviour.

The package is split by idea: `names`, `base` (action, interface, options, traits, the tracked base class),
`pearl`, `baselines` (ROLL, ROLL-Large, elastic seeding, RLBoost+), `oracle`, `registry`. Callers import
from here.
"""

from __future__ import annotations

from controlplane.core.policies import names
from controlplane.core.policies.base import (
    Dispatch,
    OptionError,
    OptionSpec,
    Policy,
    PolicyAction,
    StaticPool,
    TrackedPolicy,
)
from controlplane.core.policies.baselines import (
    ElasticPolicy,
    FixedLargePolicy,
    FixedPolicy,
    RLBoostPolicy,
    rlboost_rebalance,
)
from controlplane.core.policies.oracle import OraclePolicy
from controlplane.core.policies.pearl import BestHomogeneousPolicy, PearlPolicy
from controlplane.core.policies.registry import (
    POLICIES,
    POLICY_ALIASES,
    POLICY_NAMES,
    PRODUCT_POLICIES,
    REGISTRY,
    make_policy,
    policy_class,
    validate_options,
)

__all__ = [
    "POLICIES",
    "POLICY_ALIASES",
    "POLICY_NAMES",
    "PRODUCT_POLICIES",
    "REGISTRY",
    "BestHomogeneousPolicy",
    "Dispatch",
    "ElasticPolicy",
    "FixedLargePolicy",
    "FixedPolicy",
    "OptionError",
    "OptionSpec",
    "OraclePolicy",
    "PearlPolicy",
    "Policy",
    "PolicyAction",
    "RLBoostPolicy",
    "StaticPool",
    "TrackedPolicy",
    "make_policy",
    "names",
    "policy_class",
    "rlboost_rebalance",
    "validate_options",
]
