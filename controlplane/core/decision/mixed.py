"""The decision on a mixed pool (issue 23): one job's rollout workers on several chip types.

`evaluate_mixed` predicts every candidate over the pool (colocated and disaggregated within each type,
colocated over every type with the batch balanced, and every cross-type split); `decide_mixed` chooses
among them by the rule table `MIXED_RULES`, with `decide`'s hysteresis: a change of counts within the
same mode and chip types is a ratio change, a change of mode or of either role's chip type needs the
mode-switch threshold.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from controlplane.core.decision.candidates import (
    Candidate,
    CandidateList,
    Decision,
    Thresholds,
    best_feasible,
    expected_gain,
)
from controlplane.core.decision.homogeneous import evaluate
from controlplane.core.decision.rules import Rule, always, first_rule
from controlplane.core.predictor import (
    FeasibilityRule,
    WorkloadProfile,
    predict_colocated,
    predict_colocated_balanced,
    predict_cross,
)
from controlplane.core.profiles import EngineCoefficients
from controlplane.core.state import Configuration, Mode

MixedCandidate = Candidate
"""The one candidate type also on mixed pools (its configuration names the chip types); the old name kept."""


@dataclass(frozen=True, slots=True)
class MixedDecision:
    """What the engine chose on a mixed pool and why."""

    configuration: Configuration
    candidates: tuple[Candidate, ...]
    predicted_makespan_s: float
    current_makespan_s: float | None
    best: Configuration | None
    expected_gain: float
    admitted: bool
    forced: bool
    reason: str

    @property
    def label(self) -> str:
        return self.configuration.label()

    def as_decision(self, budget: int, inputs: Mapping[str, Any] | None = None, overridden: bool = False) -> Decision:
        """The same choice as a `Decision` (what a policy action carries), its candidates a `CandidateList`."""
        return Decision(
            self.configuration,
            budget,
            CandidateList(self.candidates),
            self.predicted_makespan_s,
            self.current_makespan_s,
            self.best,
            self.expected_gain,
            self.admitted,
            self.forced,
            overridden,
            self.reason,
            dict(inputs or {}),
        )


LinkBandwidth = Callable[[str, str], float]


def evaluate_mixed(
    workload: WorkloadProfile,
    coeffs: Mapping[str, EngineCoefficients],
    workers: Mapping[str, int],
    link: LinkBandwidth,
    rule: FeasibilityRule = FeasibilityRule(),
) -> list[Candidate]:
    """Every candidate over a mixed pool of `workers[type]` workers per chip type.

    Colocated on each type (all its workers); disaggregated within each type (every split); and every
    cross-type split: N_P = 1..N_a prefill workers of type a, decode on all N_b workers of type b (Eq. 2
    never gets slower with more decode workers), the KV crossing `link(a, b)` per worker link. Workers a
    candidate leaves out stay unused. `coeffs` are each type's coefficients (the tracker's, per type)."""
    out: list[Candidate] = []
    types = sorted(h for h, k in workers.items() if k > 0)
    for h in types:
        c, n = coeffs[h], int(workers[h])
        col = predict_colocated(workload, c, n)
        out.append(
            Candidate.of(
                Configuration.colocated(n, h),
                col.makespan_s,
                col.feasible,
                col.prefill_s,
                col.decode_s,
                0.0,
                col.env_s,
                col.why_infeasible,
            )
        )
        table = evaluate(workload, c, n, rule)
        for row in (table.row(i) for i in range(len(table.n_prefill))):
            out.append(
                Candidate.of(
                    Configuration.disaggregated(row.n_prefill, row.n_decode, h),
                    row.makespan_s,
                    row.feasible,
                    row.prefill_s,
                    row.decode_s,
                    row.kv_transfer_s,
                    row.env_s,
                    row.why_infeasible,
                )
            )
    if len(types) > 1:
        # every worker colocated with the batch balanced across the types (so they finish together), labelled
        # with every type, e.g. '8C(H20+H800)': what the sticky router's rate-weighted homing (`serving_rates`)
        # and join-the-shortest-queue dispatch both tend to
        sp = predict_colocated_balanced(workload, [(coeffs[h], int(workers[h])) for h in types])
        out.append(
            Candidate.of(
                Configuration.colocated(sp.configuration.total, "+".join(types)),
                sp.makespan_s,
                sp.feasible,
                sp.prefill_s,
                sp.decode_s,
                0.0,
                sp.env_s,
                sp.why_infeasible,
            )
        )
    for a in types:
        for b in types:
            if a == b:
                continue
            n_d = int(workers[b])
            bw = link(a, b)
            for n_p in range(1, int(workers[a]) + 1):
                p = predict_cross(workload, coeffs[a], coeffs[b], n_p, n_d, bw, rule)
                out.append(
                    Candidate.of(
                        Configuration.disaggregated(n_p, n_d, a, b),
                        p.makespan_s,
                        p.feasible,
                        p.prefill_s,
                        p.decode_s,
                        p.kv_transfer_s,
                        p.env_s,
                        p.why_infeasible,
                    )
                )
    return out


def single_type(c: Candidate) -> bool:
    """The candidate runs on one chip type only (no cross-type split, no colocation over several types)."""
    return not c.configuration.cross_type and "+" not in c.prefill_hardware


def best_homogeneous(cands: list[Candidate]) -> Candidate | None:
    """The best candidate that runs on one chip type only (the best-homogeneous baseline's choice)."""
    return best_feasible(cands, single_type)


class MixedSituation:
    """What `decide_mixed`'s rules read: the candidates, the current configuration and the figures derived
    from them, each computed when a rule first reads it (the asserting properties only by the rules after
    the one that holds when the value is missing)."""

    def __init__(
        self, workload: WorkloadProfile, cands: list[Candidate], current: Configuration | None, th: Thresholds
    ) -> None:
        self.workload, self.cands, self.current, self.th = workload, cands, current, th
        self.best = best_feasible(cands)

    def out(self, chosen: Candidate, cur_ms: float | None, admitted: bool, forced: bool, reason: str) -> MixedDecision:
        """The decision to run `chosen`."""
        best = self.best
        return MixedDecision(
            chosen.configuration,
            tuple(self.cands),
            chosen.makespan_s,
            cur_ms,
            best.configuration if best else None,
            expected_gain(cur_ms, best),
            admitted,
            forced,
            reason,
        )

    @property
    def top(self) -> Candidate:
        assert self.best is not None
        return self.best

    @property
    def now(self) -> Configuration:
        """The current configuration (read once the rules know there is one)."""
        assert self.current is not None
        return self.current

    @cached_property
    def found(self) -> Candidate | None:
        """The current configuration's candidate on this pool."""
        return next((c for c in self.cands if c.configuration == self.current), None)

    @property
    def cur(self) -> Candidate:
        assert self.found is not None
        return self.found

    @property
    def kind(self) -> tuple[Mode, str, str]:
        """The current configuration's mode and chip types: what a ratio change keeps."""
        return self.now.mode, self.now.prefill_hardware, self.now.decode_hardware

    @cached_property
    def same_kind(self) -> Candidate | None:
        """The best feasible candidate of the current configuration's kind (the incumbent when it is gone)."""
        kind = self.kind
        return best_feasible(self.cands, lambda c: c.kind == kind)

    @cached_property
    def pool_gain(self) -> float:
        """The best candidate's gain over the incumbent of the current kind."""
        assert self.same_kind is not None
        return (self.same_kind.makespan_s - self.top.makespan_s) / self.same_kind.makespan_s

    @cached_property
    def gain(self) -> float:
        return (self.cur.makespan_s - self.top.makespan_s) / self.cur.makespan_s

    @property
    def kind_kept(self) -> bool:
        """The best candidate is of the current kind (a switch to it is a ratio change)."""
        return self.top.kind == self.kind

    @property
    def threshold(self) -> float:
        return self.th.ratio_change if self.kind_kept else self.th.mode_switch

    @property
    def what(self) -> str:
        return "ratio change" if self.kind_kept else "switch of mode or chip types"

    @cached_property
    def same_kind_gain(self) -> float:
        assert self.same_kind is not None
        return (self.cur.makespan_s - self.same_kind.makespan_s) / self.cur.makespan_s


# ----------------------------------------------------------------------------------- what each rule makes
def _no_workers(s: MixedSituation) -> MixedDecision:
    empty = Candidate.of(
        Configuration.colocated(0), float("inf"), False, 0.0, 0.0, 0.0, s.workload.env_time_s, "no workers"
    )
    return s.out(empty, None, True, True, "No rollout workers in the pool.")


def _least_bad(s: MixedSituation) -> MixedDecision:
    least = min(s.cands, key=lambda c: c.makespan_s)
    return s.out(
        least,
        None,
        True,
        True,
        f"No feasible configuration ({least.why_infeasible}); running {least.label}, the least bad.",
    )


def _first(s: MixedSituation) -> MixedDecision:
    best = s.top
    homo = best_homogeneous(s.cands)
    vs = f" vs {homo.makespan_s:.1f} s for the best single type ({homo.label})" if homo and homo is not best else ""
    return s.out(best, None, True, False, f"First configuration: {best.label} predicts {best.makespan_s:.1f} s{vs}.")


def _current_gone(s: MixedSituation) -> MixedDecision:
    best, cur = s.top, s.found
    why = "is no longer a candidate on this pool" if cur is None else f"is infeasible ({cur.why_infeasible})"
    return s.out(
        best,
        cur.makespan_s if cur else None,
        True,
        True,
        f"Current {s.now.label()} {why}; switching to {best.label} ({best.makespan_s:.1f} s).",
    )


def _pool_changed_kind_kept(s: MixedSituation) -> MixedDecision:
    best, incumbent = s.top, s.same_kind
    assert incumbent is not None
    return s.out(
        incumbent,
        incumbent.makespan_s,
        incumbent is best,
        True,
        f"Pool changed: {incumbent.label} ({incumbent.makespan_s:.1f} s) keeps the kind of "
        f"{s.now.label()}; {best.label} gains {s.pool_gain:.1%} (threshold {s.th.mode_switch:.1%}).",
    )


def _pool_changed_switch(s: MixedSituation) -> MixedDecision:
    best, incumbent = s.top, s.same_kind
    assert incumbent is not None
    return s.out(
        best,
        incumbent.makespan_s,
        True,
        True,
        f"Pool changed: switching to {best.label} ({best.makespan_s:.1f} s), {s.pool_gain:.1%} faster than "
        f"{incumbent.label} (threshold {s.th.mode_switch:.1%}).",
    )


def _still_best(s: MixedSituation) -> MixedDecision:
    cur = s.cur
    return s.out(cur, cur.makespan_s, True, False, f"{cur.label} is still the best ({cur.makespan_s:.1f} s).")


def _switch(s: MixedSituation) -> MixedDecision:
    best, cur = s.top, s.cur
    return s.out(
        best,
        cur.makespan_s,
        True,
        False,
        f"{s.what.capitalize()} {cur.label}→{best.label}: {best.makespan_s:.1f} s vs {cur.makespan_s:.1f} s "
        f"({s.gain:.1%} > {s.threshold:.1%}).",
    )


def _ratio_within_kind(s: MixedSituation) -> MixedDecision:
    best, cur, same = s.top, s.cur, s.same_kind
    assert same is not None
    return s.out(
        same,
        cur.makespan_s,
        False,
        False,
        f"Ratio change {cur.label}→{same.label} ({s.same_kind_gain:.1%} > {s.th.ratio_change:.1%}); "
        f"{best.label} gains only {s.gain:.1%} (< {s.th.mode_switch:.1%}).",
    )


def _keep(s: MixedSituation) -> MixedDecision:
    best, cur = s.top, s.cur
    return s.out(
        cur,
        cur.makespan_s,
        False,
        False,
        f"Keeping {cur.label}: {best.label} would gain only {s.gain:.1%} (< {s.threshold:.1%} {s.what} threshold).",
    )


def _current_unusable(s: MixedSituation) -> bool:
    """The current configuration is no longer a candidate (its pool changed) or is infeasible."""
    return s.found is None or not s.found.feasible


# The rules in order: each may take for granted that none before it held.
MIXED_RULES: tuple[Rule[MixedSituation, MixedDecision], ...] = (
    Rule("no rollout workers", lambda s: not s.cands, _no_workers),
    Rule("no feasible configuration", lambda s: s.best is None, _least_bad),
    Rule("first configuration", lambda s: s.current is None, _first),
    # forced switches: an infeasible current, or one gone from the pool with nothing of its kind left
    Rule(
        "current gone or infeasible",
        lambda s: _current_unusable(s) and (s.same_kind is None or s.found is not None),
        _current_gone,
    ),
    # gone from the pool: the best candidate of its kind is the incumbent, as `decide` does on a budget change
    Rule(
        "pool changed, kind kept",
        lambda s: s.found is None and (s.pool_gain <= s.th.mode_switch or s.same_kind is s.best),
        _pool_changed_kind_kept,
    ),
    Rule("pool changed, switched", lambda s: s.found is None, _pool_changed_switch),
    # the hysteresis
    Rule("still the best", lambda s: s.top.configuration == s.now, _still_best),
    Rule("switch admitted", lambda s: s.gain > s.threshold, _switch),
    Rule(
        "ratio change within the kind",  # the switch of kind is not worth it; a better ratio may be
        lambda s: (
            not s.kind_kept
            and s.same_kind is not None
            and s.same_kind.configuration != s.now
            and s.same_kind_gain > s.th.ratio_change
        ),
        _ratio_within_kind,
    ),
    Rule("kept by hysteresis", always, _keep),
)


def decide_mixed(
    workload: WorkloadProfile,
    coeffs: Mapping[str, EngineCoefficients],
    workers: Mapping[str, int],
    link: LinkBandwidth,
    *,
    current: Configuration | None = None,
    thresholds: Thresholds | None = None,
    rule: FeasibilityRule | None = None,
    allow: Callable[[Candidate], bool] | None = None,
) -> MixedDecision:
    """Choose the rollout configuration on a mixed pool: the first of `MIXED_RULES` that holds decides.

    When the current configuration is no longer a candidate (its pool changed), the best candidate of its
    own kind is the incumbent and the switch is forced, as `decide` does on a budget change. `allow` keeps
    only the candidates it accepts."""
    cands = evaluate_mixed(workload, coeffs, workers, link, rule or FeasibilityRule())
    if allow is not None:  # e.g. `single_type`: the best-homogeneous baseline plans over one chip type only
        cands = [c for c in cands if allow(c)]
    return first_rule(MIXED_RULES, MixedSituation(workload, cands, current, thresholds or Thresholds()))
