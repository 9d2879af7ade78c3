"""The decision on one chip type (paper §4): mode and P:D ratio for a worker budget, with hysteresis.

`evaluate` predicts every candidate of a budget (colocation and every split N_P = 1..N_k−1); `decide`
chooses among them by the rule table `RULES`, in order: manual overrides, no feasible candidate, the first
configuration, forced switches (the budget changed, or the current configuration became infeasible), a
freeze, then the hysteresis — a switch is admitted only if it beats the current configuration by more
than a threshold, larger for a mode switch than for a ratio change.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

import numpy as np

from controlplane.core.context import Overrides
from controlplane.core.decision.candidates import Candidate, CandidateTable, Decision, Thresholds, expected_gain
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
    disaggregated_table,
    predict_colocated,
)
from controlplane.core.profiles import EngineCoefficients
from controlplane.core.state import Configuration, Mode


def evaluate(
    workload: WorkloadProfile, coeffs: EngineCoefficients, budget: int, rule: FeasibilityRule = FeasibilityRule()
) -> CandidateTable:
    """Predict every candidate configuration of `budget` workers."""
    col = None
    if budget >= 1:
        p = predict_colocated(workload, coeffs, budget)
        col = Candidate(
            Mode.COLOCATED,
            0,
            0,
            budget,
            p.makespan_s,
            p.feasible,
            p.prefill_s,
            p.decode_s,
            0.0,
            p.env_s,
            p.why_infeasible,
        )
    if budget >= 2:
        t = disaggregated_table(workload, coeffs, budget, rule)
        why = np.where(~t.kv_ok, 1, np.where(~t.keepup_ok, 2, 0)).astype(np.int8)
        return CandidateTable(
            col,
            t.n_prefill,
            t.n_decode,
            t.makespan_s,
            t.feasible,
            t.prefill_s,
            t.decode_s,
            t.kv_transfer_s,
            workload.env_time_s,
            why,
        )
    empty_i = np.zeros(0, dtype=np.int64)
    empty_f = np.zeros(0)
    return CandidateTable(
        col,
        empty_i,
        empty_i,
        empty_f,
        np.zeros(0, dtype=bool),
        empty_f,
        empty_f,
        empty_f,
        workload.env_time_s,
        np.zeros(0, dtype=np.int8),
    )


def _best(table: CandidateTable, mode: Mode | None) -> Candidate | None:
    """Best feasible candidate, optionally restricted to one mode."""
    options: list[Candidate] = []
    if mode in (None, Mode.COLOCATED) and table.colocated is not None and table.colocated.feasible:
        options.append(table.colocated)
    if mode in (None, Mode.DISAGGREGATED):
        d = table.best_disaggregated()
        if d is not None:
            options.append(d)
    if not options:
        return None
    return min(options, key=lambda c: c.makespan_s)


def _least_bad(table: CandidateTable, mode: Mode | None) -> Candidate | None:
    """When nothing is feasible: the candidate with the smallest makespan regardless (reported as such)."""
    rows: list[Candidate] = []
    if mode in (None, Mode.COLOCATED) and table.colocated is not None:
        rows.append(table.colocated)
    if mode in (None, Mode.DISAGGREGATED) and len(table.n_prefill):
        rows.append(table.row(int(np.argmin(table.makespan_s))))
    return min(rows, key=lambda c: c.makespan_s) if rows else None


def _scaled_ratio(ratio: tuple[int, int], budget: int) -> Configuration:
    p, d = ratio
    if p < 1 or d < 1:
        raise ValueError("force_ratio needs N_P >= 1 and N_D >= 1")
    if p + d == budget:
        return Configuration.disaggregated(p, d)
    n_p = int(round(budget * p / (p + d)))
    n_p = min(max(n_p, 1), budget - 1)
    return Configuration.disaggregated(n_p, budget - n_p)


def _vs_other_mode(table: CandidateTable, best: Candidate) -> str:
    other = _best(table, Mode.COLOCATED if best.mode is Mode.DISAGGREGATED else Mode.DISAGGREGATED)
    if other is None:
        return ""
    return f" vs {other.makespan_s:.1f} s for the best {other.mode} ({other.label})"


class Situation(Comparison):
    """What `decide`'s rules read: the inputs, the candidate table and the figures derived from them, each
    computed when a rule first reads it. The properties that assert a value exists are read only by the
    rules after the one that holds when it does not."""

    def __init__(
        self,
        workload: WorkloadProfile,
        coeffs: EngineCoefficients,
        budget: int,
        current: Configuration | None,
        overrides: Overrides,
        thresholds: Thresholds,
        rule: FeasibilityRule,
    ) -> None:
        self.workload, self.coeffs, self.budget, self.rule = workload, coeffs, budget, rule
        self.current, self.ov, self.th = current, overrides, thresholds
        self.table = evaluate(workload, coeffs, budget, rule)
        self.tables = {budget: self.table}  # by size: an exact forced ratio may leave workers unused
        self.inputs: dict[str, Any] = {
            "budget": budget,
            "batch_size": workload.batch_size,
            "turns": workload.turns,
            "new_prompt_tokens": workload.new_prompt_tokens,
            "generated_tokens": workload.generated_tokens,
            "theta": workload.theta,
            "env_time_s": workload.env_time_s,
            "prefill_interference": coeffs.prefill_interference,
        }

    def decision(self, v: Verdict[Configuration]) -> Decision:
        """The Decision a rule's verdict makes: run its configuration, predicted at its own size."""
        chosen = self.candidate(v.takes)
        best = self.best
        return Decision(
            v.takes,
            self.budget,
            self.table,
            chosen.makespan_s if chosen is not None else float("inf"),
            v.current_s,
            best.configuration if best else None,
            expected_gain(v.current_s, best),
            v.admitted,
            v.forced,
            v.overridden,
            v.reason,
            self.inputs,
        )

    def candidate(self, cfg: Configuration) -> Candidate | None:
        """`cfg`'s candidate, predicted on `cfg.total` workers (the budget's table unless that differs)."""
        if cfg.total not in self.tables:
            self.tables[cfg.total] = evaluate(self.workload, self.coeffs, cfg.total, self.rule)
        return self.tables[cfg.total].find(cfg)

    @cached_property
    def forced_mode(self) -> Mode | None:
        """The mode an override forces (colocated on a budget too small to disaggregate)."""
        mode = Mode(self.ov.force_mode) if self.ov.force_mode else None
        return Mode.COLOCATED if mode is Mode.DISAGGREGATED and self.budget < 2 else mode

    @property
    def ratio_forced(self) -> bool:
        """An override forces the P:D ratio (on a budget that can split)."""
        return self.ov.force_ratio is not None and self.budget >= 2

    @cached_property
    def best(self) -> Candidate | None:
        """The best feasible candidate: of the forced mode, if any, unless the ratio is forced too (that
        decision is compared with the best of either mode)."""
        return _best(self.table, None if self.ratio_forced else self.forced_mode)

    @cached_property
    def least(self) -> Candidate:
        """When nothing is feasible: the least bad candidate (of the forced mode, if any)."""
        least = _least_bad(self.table, self.forced_mode)
        assert least is not None
        return least

    @cached_property
    def ratio(self) -> tuple[Configuration, str]:
        """The configuration a forced ratio gives, and what the reason says of it: the ratio scaled to the
        budget, or the exact split when it fits."""
        assert self.ov.force_ratio is not None
        p, d = self.ov.force_ratio
        budget = self.budget
        if self.ov.exact_ratio and p + d <= budget:
            cfg = Configuration.disaggregated(p, d)
            spare = budget - p - d
            return cfg, f"exact {cfg.label()} on {budget} workers" + (f", {spare} left unused" if spare else "")
        cfg = _scaled_ratio(self.ov.force_ratio, budget)
        short = f"; exact {p}P{d}D needs {p + d} workers, so the ratio is scaled" if self.ov.exact_ratio else ""
        return cfg, f"forced ratio {p}:{d} gives {cfg.label()} on {budget} workers{short}"

    @property
    def ratio_note(self) -> str:
        c = self.candidate(self.ratio[0])
        return "" if c is not None and c.feasible else f" (predicted infeasible: {c.why_infeasible if c else 'n/a'})"

    @cached_property
    def found(self) -> Candidate | None:
        """The current configuration's candidate at this budget."""
        return self.table.find(self.current) if self.current is not None else None

    @property
    def incumbent_s(self) -> float:
        """The incumbent's makespan."""
        return self.kept.makespan_s

    @property
    def budget_changed(self) -> bool:
        return self.now.total != self.budget

    @cached_property
    def incumbent(self) -> Candidate | None:
        """On a budget change: the best candidate of the current (or forced) mode at the new budget."""
        return _best(self.table, self.now.mode if self.forced_mode is None else self.forced_mode)

    @property
    def kept(self) -> Candidate:
        assert self.incumbent is not None
        return self.incumbent

    @cached_property
    def budget_gain(self) -> float:
        return (self.kept.makespan_s - self.top.makespan_s) / self.kept.makespan_s

    @property
    def mode_switch(self) -> bool:
        """The best candidate is of the other mode."""
        return self.top.mode is not self.now.mode

    @property
    def kind_kept(self) -> bool:
        """The best candidate is of the current mode (a switch to it is a ratio change)."""
        return not self.mode_switch

    @property
    def what(self) -> str:
        return "mode switch" if self.mode_switch else "ratio change"

    @cached_property
    def same_kind(self) -> Candidate | None:
        """The best candidate of the current mode."""
        return _best(self.table, self.now.mode)


# The rules in order: each may take for granted that none before it held. What each takes: the best
# candidate, the current configuration, the incumbent (the best of its mode at a new budget) or the best
# of the current mode; what its choice is compared with: the current's makespan or the incumbent's.
def _best_one(s: Situation) -> Configuration:
    return s.top.configuration


def _current(s: Situation) -> Configuration:
    return s.now


def _mode_overridden(s: Situation) -> bool:
    return s.forced_mode is not None


RULES: tuple[Rule[Situation, Configuration], ...] = (
    Rule(
        "no rollout workers",
        lambda s: s.budget == 0,
        takes=lambda s: Configuration.colocated(0),
        admitted=True,
        forced=lambda s: s.current is not None and s.current.total != 0,
        overridden=False,
        reason=lambda s: "No rollout workers in the budget.",
    ),
    # 1. overrides always win
    Rule(
        "override: forced ratio",
        lambda s: s.ratio_forced,
        takes=lambda s: s.ratio[0],
        admitted=True,
        forced=False,
        overridden=True,
        reason=lambda s: f"Override: {s.ratio[1]}{s.ratio_note}.",
    ),
    Rule(
        "no feasible configuration",
        lambda s: s.best is None,
        takes=lambda s: s.least.configuration,
        admitted=True,
        forced=True,
        overridden=_mode_overridden,
        reason=lambda s: (
            f"No feasible configuration on {s.budget} workers ({s.least.why_infeasible}); "
            f"running {s.least.label}, the least bad."
        ),
    ),
    Rule(
        "first configuration",
        lambda s: s.current is None,
        takes=_best_one,
        admitted=True,
        forced=False,
        overridden=_mode_overridden,
        reason=lambda s: (
            f"First configuration: {s.top.label} predicts {s.top.makespan_s:.1f} s on {s.budget} "
            f"workers{_vs_other_mode(s.table, s.top)}."
        ),
    ),
    Rule(
        "override: forced mode",
        lambda s: s.forced_mode is not None and s.now.mode is not s.forced_mode,
        takes=_best_one,
        current_s=current_makespan,
        admitted=True,
        forced=False,
        overridden=True,
        reason=lambda s: f"Override: mode forced to {s.forced_mode}; {s.top.label} predicts {s.top.makespan_s:.1f} s.",
    ),
    # 2. forced switches: the budget changed, or the current configuration is infeasible
    Rule(
        "budget changed, none of its mode",
        lambda s: s.budget_changed and s.incumbent is None,
        takes=_best_one,
        admitted=True,
        forced=True,
        overridden=_mode_overridden,
        reason=lambda s: (
            f"Budget changed {s.now.total}→{s.budget} and no {s.now.mode} split is feasible; "
            f"switching to {s.top.label} ({s.top.makespan_s:.1f} s)."
        ),
    ),
    Rule(
        "budget changed, its mode kept",
        lambda s: s.budget_changed and (s.ov.freeze or s.kept.configuration == s.top.configuration),
        takes=lambda s: s.kept.configuration,
        current_s=incumbent_makespan,
        admitted=True,
        forced=True,
        overridden=lambda s: s.ov.freeze,
        reason=lambda s: (
            f"Budget changed {s.now.total}→{s.budget}: {s.kept.label} "
            f"({'frozen: keeping the mode' if s.ov.freeze else 'best'}, {s.kept.makespan_s:.1f} s)."
        ),
    ),
    Rule(
        "budget changed, mode switched",
        lambda s: s.budget_changed and s.budget_gain > s.th.mode_switch,
        takes=_best_one,
        current_s=incumbent_makespan,
        admitted=True,
        forced=True,
        overridden=False,
        reason=lambda s: (
            f"Budget changed {s.now.total}→{s.budget}: switching mode to {s.top.label} "
            f"({s.top.makespan_s:.1f} s), {s.budget_gain:.1%} faster than {s.kept.label} "
            f"(threshold {s.th.mode_switch:.1%})."
        ),
    ),
    Rule(
        "budget changed, mode switch not worth it",
        lambda s: s.budget_changed,
        takes=lambda s: s.kept.configuration,
        current_s=incumbent_makespan,
        admitted=False,
        forced=True,
        overridden=False,
        reason=lambda s: (
            f"Budget changed {s.now.total}→{s.budget}: keeping {s.now.mode} as {s.kept.label} "
            f"({s.kept.makespan_s:.1f} s); {s.top.label} is only {s.budget_gain:.1%} faster "
            f"(mode-switch threshold {s.th.mode_switch:.1%})."
        ),
    ),
    Rule(
        "current infeasible",
        lambda s: not s.cur.feasible,
        takes=_best_one,
        current_s=current_makespan,
        admitted=True,
        forced=True,
        overridden=False,
        reason=lambda s: (
            f"Current {s.cur.label} is infeasible ({s.cur.why_infeasible}); forced switch to "
            f"{s.top.label} ({s.top.makespan_s:.1f} s)."
        ),
    ),
    # 3. a freeze, then the hysteresis
    Rule(
        "frozen by override",
        lambda s: s.ov.freeze,
        takes=_current,
        current_s=current_makespan,
        admitted=False,
        forced=False,
        overridden=True,
        reason=lambda s: (
            f"Frozen by override: keeping {s.cur.label} ({s.cur.makespan_s:.1f} s; best "
            f"{s.top.label} {s.top.makespan_s:.1f} s)."
        ),
    ),
    *hysteresis_rules("mode", best=_best_one, current=_current, same=lambda s: s.same.configuration),
)


def decide(
    workload: WorkloadProfile,
    coeffs: EngineCoefficients,
    budget: int,
    *,
    current: Configuration | None = None,
    overrides: Overrides | None = None,
    thresholds: Thresholds | None = None,
    rule: FeasibilityRule | None = None,
) -> Decision:
    """Choose the rollout configuration for `budget` workers: the first of `RULES` that holds decides."""
    if budget < 0:
        raise ValueError("budget must be >= 0")
    situation = Situation(
        workload,
        coeffs,
        budget,
        current,
        overrides or Overrides(),
        thresholds or Thresholds(),
        rule or FeasibilityRule(),
    )
    return situation.decision(verdict(RULES, situation))
