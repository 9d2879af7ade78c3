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
from controlplane.core.decision.rules import (
    Comparison,
    Rule,
    Verdict,
    current_makespan,
    hysteresis_rules,
    incumbent_makespan,
    verdict,
)
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


class MixedSituation(Comparison):
    """What `decide_mixed`'s rules read: the candidates, the current configuration and the figures derived
    from them, each computed when a rule first reads it (the asserting properties only by the rules after
    the one that holds when the value is missing)."""

    def __init__(
        self, workload: WorkloadProfile, cands: list[Candidate], current: Configuration | None, th: Thresholds
    ) -> None:
        self.workload, self.cands, self.current, self.th = workload, cands, current, th

    @cached_property
    def best(self) -> Candidate | None:
        """The best feasible candidate."""
        return best_feasible(self.cands)

    def decision(self, v: Verdict[Candidate]) -> MixedDecision:
        """The decision a rule's verdict makes: run its candidate (a mixed pool takes no overrides)."""
        best = self.best
        return MixedDecision(
            v.takes.configuration,
            tuple(self.cands),
            v.takes.makespan_s,
            v.current_s,
            best.configuration if best else None,
            expected_gain(v.current_s, best),
            v.admitted,
            v.forced,
            v.reason,
        )

    @property
    def nothing(self) -> Candidate:
        """What an empty pool runs."""
        return Candidate.of(
            Configuration.colocated(0), float("inf"), False, 0.0, 0.0, 0.0, self.workload.env_time_s, "no workers"
        )

    @property
    def least(self) -> Candidate:
        """When nothing is feasible: the least bad candidate."""
        return min(self.cands, key=lambda c: c.makespan_s)

    @cached_property
    def found(self) -> Candidate | None:
        """The current configuration's candidate on this pool."""
        return next((c for c in self.cands if c.configuration == self.current), None)

    @property
    def incumbent_s(self) -> float:
        """The incumbent's makespan."""
        return self.same.makespan_s

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
        return (self.same.makespan_s - self.top.makespan_s) / self.same.makespan_s

    @property
    def kind_kept(self) -> bool:
        """The best candidate is of the current kind (a switch to it is a ratio change)."""
        return self.top.kind == self.kind

    @property
    def what(self) -> str:
        return "ratio change" if self.kind_kept else "switch of mode or chip types"

    @property
    def vs_single_type(self) -> str:
        """How the best candidate compares with the best on one chip type (when that is another one)."""
        best, homo = self.top, best_homogeneous(self.cands)
        return (
            f" vs {homo.makespan_s:.1f} s for the best single type ({homo.label})" if homo and homo is not best else ""
        )


def _current_unusable(s: MixedSituation) -> bool:
    """The current configuration is no longer a candidate (its pool changed) or is infeasible."""
    return s.found is None or not s.found.feasible


# The rules in order: each may take for granted that none before it held. What each takes: the best
# candidate, the current one, or the best of the current kind (the incumbent when the current is gone);
# what its choice is compared with: the current's makespan or the incumbent's.
def _best_one(s: MixedSituation) -> Candidate:
    return s.top


def _current(s: MixedSituation) -> Candidate:
    return s.cur


MIXED_RULES: tuple[Rule[MixedSituation, Candidate], ...] = (
    Rule(
        "no rollout workers",
        lambda s: not s.cands,
        takes=lambda s: s.nothing,
        admitted=True,
        forced=True,
        reason=lambda s: "No rollout workers in the pool.",
    ),
    Rule(
        "no feasible configuration",
        lambda s: s.best is None,
        takes=lambda s: s.least,
        admitted=True,
        forced=True,
        reason=lambda s: (
            f"No feasible configuration ({s.least.why_infeasible}); running {s.least.label}, the least bad."
        ),
    ),
    Rule(
        "first configuration",
        lambda s: s.current is None,
        takes=_best_one,
        admitted=True,
        forced=False,
        reason=lambda s: f"First configuration: {s.top.label} predicts {s.top.makespan_s:.1f} s{s.vs_single_type}.",
    ),
    # forced switches: an infeasible current, or one gone from the pool with nothing of its kind left
    Rule(
        "current gone or infeasible",
        lambda s: _current_unusable(s) and (s.same_kind is None or s.found is not None),
        takes=_best_one,
        current_s=current_makespan,
        admitted=True,
        forced=True,
        reason=lambda s: (
            f"Current {s.now.label()} "
            + (
                "is no longer a candidate on this pool"
                if s.found is None
                else f"is infeasible ({s.cur.why_infeasible})"
            )
            + f"; switching to {s.top.label} ({s.top.makespan_s:.1f} s)."
        ),
    ),
    # gone from the pool: the best candidate of its kind is the incumbent, as `decide` does on a budget change
    Rule(
        "pool changed, kind kept",
        lambda s: s.found is None and (s.pool_gain <= s.th.mode_switch or s.same_kind is s.best),
        takes=lambda s: s.same,
        current_s=incumbent_makespan,
        admitted=lambda s: s.same_kind is s.best,
        forced=True,
        reason=lambda s: (
            f"Pool changed: {s.same.label} ({s.same.makespan_s:.1f} s) keeps the kind of "
            f"{s.now.label()}; {s.top.label} gains {s.pool_gain:.1%} (threshold {s.th.mode_switch:.1%})."
        ),
    ),
    Rule(
        "pool changed, switched",
        lambda s: s.found is None,
        takes=_best_one,
        current_s=incumbent_makespan,
        admitted=True,
        forced=True,
        reason=lambda s: (
            f"Pool changed: switching to {s.top.label} ({s.top.makespan_s:.1f} s), {s.pool_gain:.1%} "
            f"faster than {s.same.label} (threshold {s.th.mode_switch:.1%})."
        ),
    ),
    # the hysteresis
    *hysteresis_rules("kind", best=_best_one, current=_current, same=lambda s: s.same),
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
    situation = MixedSituation(workload, cands, current, thresholds or Thresholds())
    return situation.decision(verdict(MIXED_RULES, situation))
