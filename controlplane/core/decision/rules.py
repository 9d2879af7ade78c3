"""A decision as an ordered rule table: the first rule whose condition holds makes the decision.

Both decisions (`homogeneous.decide`, `mixed.decide_mixed`) are written this way. A rule's condition reads
a situation (the candidates, the current configuration and the figures derived from them, each computed
when a rule first reads it) and may take for granted that every rule before it did not hold: the order
is the policy (overrides, then forced switches, then the hysteresis). Each rule is named by what the
decision's reason says happened.

A rule is data: which configuration it takes, the makespan that choice is compared with, its three flags
and its reason. `Rule.verdict` reads them off a situation; each situation builds its decision record from
a `Verdict` in one place, so no rule spells a decision out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Generic, Protocol, TypeVar, Union

S = TypeVar("S")  # the situation the rules read
T = TypeVar("T")  # what a rule takes: a configuration, or a candidate

Flag = Union[bool, Callable[[S], bool]]  # noqa: UP007  (a generic alias: `|` cannot be subscripted with S)
"""A decision flag: fixed for the rule, or read off the situation."""


def nothing(_: object) -> None:
    """A rule's `current_s` when it compares its choice with no current configuration."""
    return None


def always(_: object) -> bool:
    """The last rule's condition."""
    return True


class Compares(Protocol):
    """A situation whose rules compare a choice with the current configuration or with the incumbent."""

    @property
    def current_s(self) -> float | None: ...

    @property
    def incumbent_s(self) -> float: ...


def current_makespan(s: Compares) -> float | None:
    """A rule's `current_s`: the current configuration's makespan (None when it is not a candidate)."""
    return s.current_s


def incumbent_makespan(s: Compares) -> float:
    """A rule's `current_s` when the current configuration is gone: the incumbent's makespan."""
    return s.incumbent_s


@dataclass(frozen=True, slots=True)
class Verdict(Generic[T]):
    """What a rule made of a situation: every field of the decision that is the rule's to say."""

    rule: str
    takes: T
    current_s: float | None
    admitted: bool
    forced: bool
    overridden: bool
    reason: str


@dataclass(frozen=True, slots=True)
class Rule(Generic[S, T]):
    """When `holds`: run what `takes` names, compared with `current_s` (the makespan of what it replaces,
    None when it compares with nothing), with these flags; `reason` says why, in the words of `name`."""

    name: str
    holds: Callable[[S], bool]
    _: KW_ONLY
    takes: Callable[[S], T]
    current_s: Callable[[S], float | None] = nothing
    admitted: Flag[S]
    forced: Flag[S]
    overridden: Flag[S] = False
    reason: Callable[[S], str]

    def verdict(self, situation: S) -> Verdict[T]:
        """This rule's decision fields on `situation`."""

        def flag(f: Flag[S]) -> bool:
            return f(situation) if callable(f) else f

        return Verdict(
            self.name,
            self.takes(situation),
            self.current_s(situation),
            flag(self.admitted),
            flag(self.forced),
            flag(self.overridden),
            self.reason(situation),
        )


def first_rule(rules: Sequence[Rule[S, T]], situation: S) -> Rule[S, T]:
    """The first rule that holds; a table ends with a rule that always does."""
    for rule in rules:
        if rule.holds(situation):
            return rule
    raise AssertionError("a rule table must end with a rule that always holds")


def verdict(rules: Sequence[Rule[S, T]], situation: S) -> Verdict[T]:
    """What the first rule that holds makes of `situation`."""
    return first_rule(rules, situation).verdict(situation)
