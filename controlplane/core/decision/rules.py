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
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar, Union

if TYPE_CHECKING:
    from controlplane.core.decision.candidates import Candidate, Thresholds
    from controlplane.core.state import Configuration

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


class Comparison:
    """What both decisions' situations derive alike from their candidates, and what the hysteresis rules read:
    the best candidate `top`, the current one `cur` (its configuration `now`), the best candidate of the
    current kind `same`, the gains over `cur` and the threshold that applies. A situation says which is which:
    `best`, `current`, `found` (the current configuration's candidate), `same_kind`, `kind_kept` (a switch to
    `top` keeps the current kind: a ratio change), `what` that switch is, and its thresholds `th`."""

    current: Configuration | None
    th: Thresholds

    @property
    def best(self) -> Candidate | None:
        raise NotImplementedError

    @property
    def found(self) -> Candidate | None:
        raise NotImplementedError

    @property
    def incumbent_s(self) -> float:
        raise NotImplementedError

    @property
    def same_kind(self) -> Candidate | None:
        raise NotImplementedError

    @property
    def kind_kept(self) -> bool:
        raise NotImplementedError

    @property
    def what(self) -> str:
        raise NotImplementedError

    @property
    def top(self) -> Candidate:
        assert self.best is not None
        return self.best

    @property
    def now(self) -> Configuration:
        """The current configuration (read once the rules know there is one)."""
        assert self.current is not None
        return self.current

    @property
    def cur(self) -> Candidate:
        assert self.found is not None
        return self.found

    @property
    def current_s(self) -> float | None:
        """The current configuration's makespan, if it is a candidate."""
        return self.found.makespan_s if self.found else None

    @property
    def same(self) -> Candidate:
        assert self.same_kind is not None
        return self.same_kind

    @property
    def gain(self) -> float:
        return (self.cur.makespan_s - self.top.makespan_s) / self.cur.makespan_s

    @property
    def same_kind_gain(self) -> float:
        return (self.cur.makespan_s - self.same.makespan_s) / self.cur.makespan_s

    @property
    def threshold(self) -> float:
        return self.th.ratio_change if self.kind_kept else self.th.mode_switch


H = TypeVar("H", bound=Comparison)


def hysteresis_rules(
    kind: str, *, best: Callable[[H], T], current: Callable[[H], T], same: Callable[[H], T]
) -> tuple[Rule[H, T], ...]:
    """The end of both decisions' tables: keep the current configuration while it is the best, switch where the
    gain beats the threshold of its kind of switch, else a better ratio of the current `kind` ("mode", "kind")
    where that alone beats the ratio-change threshold, else keep. `best`, `current` and `same` say what the
    table takes for the top candidate, the current one and the best of the current kind."""
    return (
        Rule(
            "still the best",
            lambda s: s.top.configuration == s.now,
            takes=current,
            current_s=current_makespan,
            admitted=True,
            forced=False,
            reason=lambda s: f"{s.cur.label} is still the best ({s.cur.makespan_s:.1f} s); no change.",
        ),
        Rule(
            "switch admitted",
            lambda s: s.gain > s.threshold,
            takes=best,
            current_s=current_makespan,
            admitted=True,
            forced=False,
            reason=lambda s: (
                f"{s.what.capitalize()} {s.cur.label}→{s.top.label}: predicted {s.top.makespan_s:.1f} s "
                f"vs {s.cur.makespan_s:.1f} s ({s.gain:.1%} > {s.threshold:.1%})."
            ),
        ),
        Rule(
            f"ratio change within the {kind}",  # the switch of kind is not worth it; a better ratio may be
            lambda s: (
                not s.kind_kept
                and s.same_kind is not None
                and s.same_kind.configuration != s.now
                and s.same_kind_gain > s.th.ratio_change
            ),
            takes=same,
            current_s=current_makespan,
            admitted=False,
            forced=False,
            reason=lambda s: (
                f"Ratio change {s.cur.label}→{s.same.label} ({s.same_kind_gain:.1%} > "
                f"{s.th.ratio_change:.1%}); the {s.what} to {s.top.label} gains only {s.gain:.1%} "
                f"(< {s.th.mode_switch:.1%})."
            ),
        ),
        Rule(
            "kept by hysteresis",
            always,
            takes=current,
            current_s=current_makespan,
            admitted=False,
            forced=False,
            reason=lambda s: (
                f"Keeping {s.cur.label}: {s.top.label} would gain only {s.gain:.1%} "
                f"(< {s.threshold:.1%} {s.what} threshold)."
            ),
        ),
    )
