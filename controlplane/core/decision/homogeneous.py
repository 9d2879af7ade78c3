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
from controlplane.core.decision.rules import Rule, always, first_rule
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


class Situation:
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

    def make(
        self,
        cfg: Configuration,
        *,
        best: Candidate | None,
        cur_ms: float | None,
        admitted: bool,
        forced: bool,
        overridden: bool,
        reason: str,
        predicted_s: float | None = None,
    ) -> Decision:
        """The Decision to run `cfg`; its predicted makespan is the table's unless `predicted_s` says it."""
        if predicted_s is None:
            chosen = self.table.find(cfg)
            predicted_s = chosen.makespan_s if chosen is not None else float("inf")
        return Decision(
            cfg,
            self.budget,
            self.table,
            predicted_s,
            cur_ms,
            best.configuration if best else None,
            expected_gain(cur_ms, best),
            admitted,
            forced,
            overridden,
            reason,
            self.inputs,
        )

    @cached_property
    def forced_mode(self) -> Mode | None:
        """The mode an override forces (colocated on a budget too small to disaggregate)."""
        mode = Mode(self.ov.force_mode) if self.ov.force_mode else None
        return Mode.COLOCATED if mode is Mode.DISAGGREGATED and self.budget < 2 else mode

    @cached_property
    def best(self) -> Candidate | None:
        """The best feasible candidate (of the forced mode, if any)."""
        return _best(self.table, self.forced_mode)

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
        """The current configuration's candidate at this budget."""
        return self.table.find(self.current) if self.current is not None else None

    @property
    def cur(self) -> Candidate:
        assert self.found is not None
        return self.found

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

    @cached_property
    def gain(self) -> float:
        return (self.cur.makespan_s - self.top.makespan_s) / self.cur.makespan_s

    @property
    def mode_switch(self) -> bool:
        """The best candidate is of the other mode."""
        return self.top.mode is not self.now.mode

    @property
    def threshold(self) -> float:
        return self.th.mode_switch if self.mode_switch else self.th.ratio_change

    @property
    def kind(self) -> str:
        return "mode switch" if self.mode_switch else "ratio change"

    @cached_property
    def same_mode(self) -> Candidate | None:
        """The best candidate of the current mode."""
        return _best(self.table, self.now.mode)

    @cached_property
    def same_mode_gain(self) -> float:
        assert self.same_mode is not None
        return (self.cur.makespan_s - self.same_mode.makespan_s) / self.cur.makespan_s


# ----------------------------------------------------------------------------------- what each rule makes
def _no_workers(s: Situation) -> Decision:
    return s.make(
        Configuration.colocated(0),
        best=None,
        cur_ms=None,
        admitted=True,
        forced=s.current is not None and s.current.total != 0,
        overridden=False,
        reason="No rollout workers in the budget.",
    )


def _override_ratio(s: Situation) -> Decision:
    """The forced ratio, scaled to the budget or exact; an exact split on fewer workers is predicted at its
    own size."""
    assert s.ov.force_ratio is not None
    p, d = s.ov.force_ratio
    budget = s.budget
    if s.ov.exact_ratio and p + d <= budget:
        cfg = Configuration.disaggregated(p, d)
        spare = budget - p - d
        what = f"exact {cfg.label()} on {budget} workers" + (f", {spare} left unused" if spare else "")
    else:
        cfg = _scaled_ratio(s.ov.force_ratio, budget)
        short = f"; exact {p}P{d}D needs {p + d} workers, so the ratio is scaled" if s.ov.exact_ratio else ""
        what = f"forced ratio {p}:{d} gives {cfg.label()} on {budget} workers{short}"
    c = evaluate(s.workload, s.coeffs, cfg.total, s.rule).find(cfg) if cfg.total != budget else s.table.find(cfg)
    note = "" if c is not None and c.feasible else f" (predicted infeasible: {c.why_infeasible if c else 'n/a'})"
    return s.make(
        cfg,
        best=_best(s.table, None),
        cur_ms=None,
        admitted=True,
        forced=False,
        overridden=True,
        reason=f"Override: {what}{note}.",
        predicted_s=c.makespan_s if c is not None else float("inf"),
    )


def _least_bad_one(s: Situation) -> Decision:
    least = _least_bad(s.table, s.forced_mode)
    assert least is not None
    return s.make(
        least.configuration,
        best=None,
        cur_ms=None,
        admitted=True,
        forced=True,
        overridden=s.forced_mode is not None,
        reason=f"No feasible configuration on {s.budget} workers ({least.why_infeasible}); "
        f"running {least.label}, the least bad.",
    )


def _first(s: Situation) -> Decision:
    best = s.top
    return s.make(
        best.configuration,
        best=best,
        cur_ms=None,
        admitted=True,
        forced=False,
        overridden=s.forced_mode is not None,
        reason=f"First configuration: {best.label} predicts {best.makespan_s:.1f} s on {s.budget} workers"
        + _vs_other_mode(s.table, best)
        + ".",
    )


def _override_mode(s: Situation) -> Decision:
    best = s.top
    return s.make(
        best.configuration,
        best=best,
        cur_ms=s.found.makespan_s if s.found else None,
        admitted=True,
        forced=False,
        overridden=True,
        reason=f"Override: mode forced to {s.forced_mode}; {best.label} predicts {best.makespan_s:.1f} s.",
    )


def _budget_changed_no_incumbent(s: Situation) -> Decision:
    best = s.top
    return s.make(
        best.configuration,
        best=best,
        cur_ms=None,
        admitted=True,
        forced=True,
        overridden=s.forced_mode is not None,
        reason=f"Budget changed {s.now.total}→{s.budget} and no {s.now.mode} split is feasible; "
        f"switching to {best.label} ({best.makespan_s:.1f} s).",
    )


def _budget_changed_incumbent(s: Situation) -> Decision:
    incumbent = s.kept
    why = "frozen: keeping the mode" if s.ov.freeze else "best"
    return s.make(
        incumbent.configuration,
        best=s.top,
        cur_ms=incumbent.makespan_s,
        admitted=True,
        forced=True,
        overridden=s.ov.freeze,
        reason=f"Budget changed {s.now.total}→{s.budget}: {incumbent.label} ({why}, {incumbent.makespan_s:.1f} s).",
    )


def _budget_changed_switch_mode(s: Situation) -> Decision:
    best, incumbent = s.top, s.kept
    return s.make(
        best.configuration,
        best=best,
        cur_ms=incumbent.makespan_s,
        admitted=True,
        forced=True,
        overridden=False,
        reason=f"Budget changed {s.now.total}→{s.budget}: switching mode to {best.label} "
        f"({best.makespan_s:.1f} s), {s.budget_gain:.1%} faster than {incumbent.label} "
        f"(threshold {s.th.mode_switch:.1%}).",
    )


def _budget_changed_keep_mode(s: Situation) -> Decision:
    best, incumbent = s.top, s.kept
    return s.make(
        incumbent.configuration,
        best=best,
        cur_ms=incumbent.makespan_s,
        admitted=False,
        forced=True,
        overridden=False,
        reason=f"Budget changed {s.now.total}→{s.budget}: keeping {s.now.mode} as {incumbent.label} "
        f"({incumbent.makespan_s:.1f} s); {best.label} is only {s.budget_gain:.1%} faster "
        f"(mode-switch threshold {s.th.mode_switch:.1%}).",
    )


def _current_infeasible(s: Situation) -> Decision:
    best, cur = s.top, s.cur
    return s.make(
        best.configuration,
        best=best,
        cur_ms=cur.makespan_s,
        admitted=True,
        forced=True,
        overridden=False,
        reason=f"Current {cur.label} is infeasible ({cur.why_infeasible}); forced switch to "
        f"{best.label} ({best.makespan_s:.1f} s).",
    )


def _frozen(s: Situation) -> Decision:
    best, cur = s.top, s.cur
    return s.make(
        s.now,
        best=best,
        cur_ms=cur.makespan_s,
        admitted=False,
        forced=False,
        overridden=True,
        reason=f"Frozen by override: keeping {cur.label} ({cur.makespan_s:.1f} s; best {best.label} "
        f"{best.makespan_s:.1f} s).",
    )


def _still_best(s: Situation) -> Decision:
    cur = s.cur
    return s.make(
        s.now,
        best=s.top,
        cur_ms=cur.makespan_s,
        admitted=True,
        forced=False,
        overridden=False,
        reason=f"{cur.label} is still the best ({cur.makespan_s:.1f} s); no change.",
    )


def _switch(s: Situation) -> Decision:
    best, cur = s.top, s.cur
    return s.make(
        best.configuration,
        best=best,
        cur_ms=cur.makespan_s,
        admitted=True,
        forced=False,
        overridden=False,
        reason=f"{s.kind.capitalize()} {cur.label}→{best.label}: predicted {best.makespan_s:.1f} s vs "
        f"{cur.makespan_s:.1f} s ({s.gain:.1%} > {s.threshold:.1%}).",
    )


def _ratio_within_mode(s: Situation) -> Decision:
    best, cur, same = s.top, s.cur, s.same_mode
    assert same is not None
    return s.make(
        same.configuration,
        best=best,
        cur_ms=cur.makespan_s,
        admitted=False,
        forced=False,
        overridden=False,
        reason=f"Ratio change {cur.label}→{same.label} ({s.same_mode_gain:.1%} > {s.th.ratio_change:.1%}); "
        f"the mode switch to {best.label} gains only {s.gain:.1%} "
        f"(< {s.th.mode_switch:.1%}).",
    )


def _keep(s: Situation) -> Decision:
    best, cur = s.top, s.cur
    return s.make(
        s.now,
        best=best,
        cur_ms=cur.makespan_s,
        admitted=False,
        forced=False,
        overridden=False,
        reason=f"Keeping {cur.label}: {best.label} would gain only {s.gain:.1%} "
        f"(< {s.threshold:.1%} {s.kind} threshold).",
    )


# The rules in order: each may take for granted that none before it held.
RULES: tuple[Rule[Situation, Decision], ...] = (
    Rule("no rollout workers", lambda s: s.budget == 0, _no_workers),
    # 1. overrides always win
    Rule("override: forced ratio", lambda s: s.ov.force_ratio is not None and s.budget >= 2, _override_ratio),
    Rule("no feasible configuration", lambda s: s.best is None, _least_bad_one),
    Rule("first configuration", lambda s: s.current is None, _first),
    Rule(
        "override: forced mode", lambda s: s.forced_mode is not None and s.now.mode is not s.forced_mode, _override_mode
    ),
    # 2. forced switches: the budget changed, or the current configuration is infeasible
    Rule(
        "budget changed, none of its mode",
        lambda s: s.budget_changed and s.incumbent is None,
        _budget_changed_no_incumbent,
    ),
    Rule(
        "budget changed, its mode kept",
        lambda s: s.budget_changed and (s.ov.freeze or s.kept.configuration == s.top.configuration),
        _budget_changed_incumbent,
    ),
    Rule(
        "budget changed, mode switched",
        lambda s: s.budget_changed and s.budget_gain > s.th.mode_switch,
        _budget_changed_switch_mode,
    ),
    Rule("budget changed, mode switch not worth it", lambda s: s.budget_changed, _budget_changed_keep_mode),
    Rule("current infeasible", lambda s: not s.cur.feasible, _current_infeasible),
    # 3. a freeze, then the hysteresis
    Rule("frozen by override", lambda s: s.ov.freeze, _frozen),
    Rule("still the best", lambda s: s.top.configuration == s.now, _still_best),
    Rule("switch admitted", lambda s: s.gain > s.threshold, _switch),
    Rule(
        "ratio change within the mode",  # the mode switch is not worth it; a better ratio within the mode may be
        lambda s: (
            s.mode_switch
            and s.same_mode is not None
            and s.same_mode.configuration != s.now
            and s.same_mode_gain > s.th.ratio_change
        ),
        _ratio_within_mode,
    ),
    Rule("kept by hysteresis", always, _keep),
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
    return first_rule(RULES, situation)
