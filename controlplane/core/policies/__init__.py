"""Rollout scheduling policies behind one interface and one registry, used unchanged by the live
control plane and the simulator (`sim`).

    policy = make_policy("pearl" | "fixed" | "fixed-large" | "elastic" | "oracle", profile=..., batch_size=...,
                         **options)       # options validated against the policy's OptionSpecs
    action = policy.on_event(ctx)          # on every elastic signal / budget change
    policy.observe(record)                 # feed a TelemetryRecord (runtime tracker input)

`PolicyContext` (core.context) describes the world at an elastic signal; `PolicyAction` is what the
policy wants: a target Configuration over the workers it will use (dedicated + borrowed overlap
workers), how many overlap (training-GPU) workers to borrow, and the Decision that explains it.

`POLICIES` (registry.py) is the one list of policy names, what each is, whether a user may run it as a
product policy, and its options (name, type, default, bounds): the API, the job form, the CLI, the
simulator's scenarios and the docs all read it.

The package is split by idea: `base` (action, interface, options, the tracked base class), `pearl`,
`baselines` (fixed, fixed-large, elastic, rlboost+), `oracle`, `registry`. Callers import from here.
"""
from __future__ import annotations

from controlplane.core.policies.base import OptionError, OptionSpec, Policy, PolicyAction, TrackedPolicy
from controlplane.core.policies.baselines import (
    ElasticPolicy,
    FixedLargePolicy,
    FixedPolicy,
    RLBoostPolicy,
    rlboost_rebalance,
)
from controlplane.core.policies.oracle import OraclePolicy
from controlplane.core.policies.pearl import PearlPolicy
from controlplane.core.policies.registry import (
    POLICIES,
    POLICY_ALIASES,
    POLICY_NAMES,
    PRODUCT_POLICIES,
    make_policy,
    policy_class,
    validate_options,
)

__all__ = [
    "POLICIES", "POLICY_ALIASES", "POLICY_NAMES", "PRODUCT_POLICIES", "ElasticPolicy", "FixedLargePolicy",
    "FixedPolicy", "OptionError", "OptionSpec", "OraclePolicy", "PearlPolicy", "Policy", "PolicyAction",
    "RLBoostPolicy", "TrackedPolicy", "make_policy", "policy_class", "rlboost_rebalance", "validate_options",
]
