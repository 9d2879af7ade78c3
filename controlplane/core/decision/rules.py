"""A decision as an ordered rule table: the first rule whose condition holds makes the decision.

Both decisions (`homogeneous.decide`, `mixed.decide_mixed`) are written this way. A rule's condition reads
a situation (the candidates, the current configuration and the figures derived from them, each computed
when a rule first reads it) and may take for granted that every rule before it did not hold: the order
is the policy (overrides, then forced switches, then the hysteresis). Each rule is named by what the
decision's reason says happened.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

S = TypeVar("S")  # the situation the rules read
D = TypeVar("D")  # the decision they make


@dataclass(frozen=True, slots=True)
class Rule(Generic[S, D]):
    """When `holds`, `makes` the decision (its reason says why, in the words of `name`)."""

    name: str
    holds: Callable[[S], bool]
    makes: Callable[[S], D]


def first_rule(rules: Sequence[Rule[S, D]], situation: S) -> D:
    """The decision of the first rule that holds; a table ends with a rule that always does."""
    for rule in rules:
        if rule.holds(situation):
            return rule.makes(situation)
    raise AssertionError("a rule table must end with a rule that always holds")


def always(_: object) -> bool:
    """The last rule's condition."""
    return True
