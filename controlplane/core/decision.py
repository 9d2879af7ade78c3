"""PD decision engine (paper §4): mode and P:D ratio for a worker budget, with hysteresis.

On every elastic signal: enumerate N_P = 1..N_k−1 (N_D = N_k − N_P), drop infeasible splits,
compare the best disaggregated split with colocation, then admit the switch only if it beats the
current configuration by more than a threshold — larger for a mode switch than for a ratio change,
because a mode switch rebinds every worker's role, router and CUDA graphs ("tens of seconds", §4).
Forced switches (current infeasible, or its worker count no longer matches the budget) bypass the
hysteresis; manual overrides always win.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from controlplane.core.borrowing import GateResult
from controlplane.core.context import Overrides
from controlplane.core.predictor import (
    FeasibilityRule,
    WorkloadProfile,
    disaggregated_table,
    predict_colocated,
    predict_colocated_balanced,
    predict_cross,
)
from controlplane.core.profiles import EngineCoefficients
from controlplane.core.state import Configuration, Mode


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Hysteresis: minimum relative predicted gain (T_cur − T_new)/T_cur to admit a switch.

    Defaults (the paper gives none): 1% for a ratio change — one role flip costs a drain (about one
    turn's decode, < 1 s) plus milliseconds, ≈1% of a ~70 s SWE-bench rollout, and the paper's own
    selection gap on Table 2 is 0.4%; 3% for a mode switch — it re-roles every worker at once (drain,
    router and CUDA-graph rebuild), a few seconds of lost capacity per step. Settable per job.
    """

    ratio_change: float = 0.01
    mode_switch: float = 0.03

    def __post_init__(self) -> None:
        if self.ratio_change < 0 or self.mode_switch < 0:
            raise ValueError("thresholds must be >= 0")


@dataclass(frozen=True, slots=True)
class Candidate:
    """One evaluated configuration."""

    mode: Mode
    n_prefill: int
    n_decode: int
    n_colocated: int
    makespan_s: float
    feasible: bool
    prefill_s: float
    decode_s: float
    kv_transfer_s: float
    env_s: float
    why_infeasible: str = ""
    # on a mixed pool, the chip types of the prefill (or colocated) and decode workers ("" = the job's one)
    prefill_hardware: str = ""
    decode_hardware: str = ""

    @classmethod
    def of(
        cls,
        config: Configuration,
        makespan_s: float,
        feasible: bool,
        prefill_s: float,
        decode_s: float,
        kv_transfer_s: float,
        env_s: float,
        why_infeasible: str = "",
    ) -> Candidate:
        """The candidate of a (possibly typed) configuration with its predicted parts."""
        return cls(
            config.mode,
            config.n_prefill,
            config.n_decode,
            config.n_colocated,
            makespan_s,
            feasible,
            prefill_s,
            decode_s,
            kv_transfer_s,
            env_s,
            why_infeasible,
            config.prefill_hardware,
            config.decode_hardware,
        )

    @property
    def configuration(self) -> Configuration:
        if self.mode is Mode.COLOCATED:
            return Configuration.colocated(self.n_colocated, self.prefill_hardware)
        return Configuration.disaggregated(self.n_prefill, self.n_decode, self.prefill_hardware, self.decode_hardware)

    @property
    def label(self) -> str:
        return self.configuration.label()

    @property
    def kind(self) -> tuple[Mode, str, str]:
        """What a switch changes besides counts: the mode and the chip types of each role."""
        return self.mode, self.prefill_hardware, self.decode_hardware

    def to_json(self, *, typed: bool = False) -> dict[str, Any]:
        """The candidate as the decision's record and the dashboard show it; `typed` adds its chip types."""
        out: dict[str, Any] = {
            "label": self.label,
            "mode": str(self.mode),
            "n_prefill": self.n_prefill,
            "n_decode": self.n_decode,
            "n_colocated": self.n_colocated,
            "makespan_s": self.makespan_s,
            "feasible": self.feasible,
            "prefill_s": self.prefill_s,
            "decode_s": self.decode_s,
            "kv_transfer_s": self.kv_transfer_s,
            "env_s": self.env_s,
            "why_infeasible": self.why_infeasible,
        }
        if typed:
            out["prefill_hardware"], out["decode_hardware"] = self.prefill_hardware, self.decode_hardware
        return out


@dataclass(frozen=True, slots=True)
class CandidateTable:
    """Every candidate of one decision: colocation plus all disaggregated splits (numpy-backed,
    so a 32k-worker budget does not build 32k objects unless someone iterates)."""

    colocated: Candidate | None
    n_prefill: np.ndarray
    n_decode: np.ndarray
    makespan_s: np.ndarray
    feasible: np.ndarray
    prefill_s: np.ndarray
    decode_s: np.ndarray
    kv_transfer_s: np.ndarray
    env_s: float
    why: np.ndarray  # per split: 0 ok, 1 decode KV does not fit, 2 prefill cannot keep up

    def __len__(self) -> int:
        return len(self.n_prefill) + (1 if self.colocated is not None else 0)

    def __iter__(self) -> Iterator[Candidate]:
        if self.colocated is not None:
            yield self.colocated
        for i in range(len(self.n_prefill)):
            yield self.row(i)

    def row(self, i: int) -> Candidate:
        why = ("", "decode KV does not fit: B·K_seq > N_D·H_max", "prefill cannot keep up")[int(self.why[i])]
        return Candidate(
            Mode.DISAGGREGATED,
            int(self.n_prefill[i]),
            int(self.n_decode[i]),
            0,
            float(self.makespan_s[i]),
            bool(self.feasible[i]),
            float(self.prefill_s[i]),
            float(self.decode_s[i]),
            float(self.kv_transfer_s[i]),
            self.env_s,
            why,
        )

    def find(self, config: Configuration) -> Candidate | None:
        if config.mode is Mode.COLOCATED:
            c = self.colocated
            return c if c is not None and c.n_colocated == config.n_colocated else None
        i = config.n_prefill - 1
        if 0 <= i < len(self.n_prefill) and int(self.n_decode[i]) == config.n_decode:
            return self.row(i)
        return None

    def best_disaggregated(self) -> Candidate | None:
        if not len(self.n_prefill) or not self.feasible.any():
            return None
        ms = np.where(self.feasible, self.makespan_s, np.inf)
        return self.row(int(np.argmin(ms)))

    def to_list(self) -> list[dict[str, Any]]:
        return [c.to_json() for c in self]


@dataclass(frozen=True, slots=True)
class CandidateList:
    """Every candidate of one decision on a mixed pool (typed configurations), with `CandidateTable`'s
    reading interface, so a `Decision` reads the same whichever pool it was made on."""

    rows: tuple[Candidate, ...]

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[Candidate]:
        return iter(self.rows)

    @property
    def colocated(self) -> Candidate | None:
        """The best feasible colocated candidate (else the best colocated one)."""
        col = [c for c in self.rows if c.mode is Mode.COLOCATED]
        ok = [c for c in col if c.feasible] or col
        return min(ok, key=lambda c: c.makespan_s) if ok else None

    def find(self, config: Configuration) -> Candidate | None:
        return next((c for c in self.rows if c.configuration == config), None)

    def best_disaggregated(self) -> Candidate | None:
        return _best_mixed(list(self.rows), lambda c: c.mode is Mode.DISAGGREGATED)

    def to_list(self) -> list[dict[str, Any]]:
        return [c.to_json(typed=True) for c in self.rows]


@dataclass(frozen=True, slots=True)
class Decision:
    """What the engine chose and why (the dashboard shows this)."""

    configuration: Configuration
    budget: int
    candidates: CandidateTable | CandidateList
    predicted_makespan_s: float  # of the chosen configuration
    current_makespan_s: float | None  # of the current configuration at this budget (None if not comparable)
    best: Configuration | None  # the best feasible candidate, admitted or not
    expected_gain: float  # (T_current − T_best)/T_current; 0 when no current
    admitted: bool  # the switch to `best` was admitted (False: hysteresis kept the current one)
    forced: bool  # switch bypassed hysteresis (infeasible current or budget change)
    overridden: bool
    reason: str
    inputs: dict[str, Any] = field(default_factory=dict)
    gate: GateResult | None = None  # when the policy evaluated Eq. 7 for this decision

    @property
    def mode(self) -> Mode:
        return self.configuration.mode

    @property
    def n_prefill(self) -> int:
        return self.configuration.n_prefill

    @property
    def n_decode(self) -> int:
        return self.configuration.n_decode

    @property
    def n_colocated(self) -> int:
        return self.configuration.n_colocated

    @property
    def label(self) -> str:
        return self.configuration.label()


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
    """Choose the rollout configuration for `budget` workers."""
    if budget < 0:
        raise ValueError("budget must be >= 0")
    ov = overrides or Overrides()
    th = thresholds or Thresholds()
    rule = rule or FeasibilityRule()
    table = evaluate(workload, coeffs, budget, rule)
    inputs = {
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
        cfg: Configuration,
        *,
        best: Candidate | None,
        cur_ms: float | None,
        admitted: bool,
        forced: bool,
        overridden: bool,
        reason: str,
    ) -> Decision:
        chosen = table.find(cfg)
        ms = chosen.makespan_s if chosen is not None else float("inf")
        gain = 0.0
        if cur_ms is not None and best is not None and np.isfinite(cur_ms) and cur_ms > 0:
            gain = (cur_ms - best.makespan_s) / cur_ms
        return Decision(
            cfg,
            budget,
            table,
            ms,
            cur_ms,
            best.configuration if best else None,
            float(gain),
            admitted,
            forced,
            overridden,
            reason,
            inputs,
        )

    def make_for(cfg: Configuration, chosen: Candidate | None, *, best: Candidate | None, reason: str) -> Decision:
        """An override's decision: the chosen candidate may come from a smaller budget (exact P:D)."""
        ms = chosen.makespan_s if chosen is not None else float("inf")
        return Decision(
            cfg, budget, table, ms, None, best.configuration if best else None, 0.0, True, False, True, reason, inputs
        )

    if budget == 0:
        return make(
            Configuration.colocated(0),
            best=None,
            cur_ms=None,
            admitted=True,
            forced=current is not None and current.total != 0,
            overridden=False,
            reason="No rollout workers in the budget.",
        )

    # 1. Overrides always win.
    forced_mode = Mode(ov.force_mode) if ov.force_mode else None
    if ov.force_ratio is not None and budget >= 2:
        p, d = ov.force_ratio
        if ov.exact_ratio and p + d <= budget:
            cfg = Configuration.disaggregated(p, d)
            spare = budget - p - d
            what = f"exact {cfg.label()} on {budget} workers" + (f", {spare} left unused" if spare else "")
        else:
            cfg = _scaled_ratio(ov.force_ratio, budget)
            short = f"; exact {p}P{d}D needs {p + d} workers, so the ratio is scaled" if ov.exact_ratio else ""
            what = f"forced ratio {p}:{d} gives {cfg.label()} on {budget} workers{short}"
        c = evaluate(workload, coeffs, cfg.total, rule).find(cfg) if cfg.total != budget else table.find(cfg)
        note = "" if c is not None and c.feasible else f" (predicted infeasible: {c.why_infeasible if c else 'n/a'})"
        return make_for(cfg, c, best=_best(table, None), reason=f"Override: {what}{note}.")
    if forced_mode is Mode.DISAGGREGATED and budget < 2:
        forced_mode = Mode.COLOCATED
    mode_filter = forced_mode

    best = _best(table, mode_filter)
    if best is None:
        least = _least_bad(table, mode_filter)
        assert least is not None
        return make(
            least.configuration,
            best=None,
            cur_ms=None,
            admitted=True,
            forced=True,
            overridden=forced_mode is not None,
            reason=f"No feasible configuration on {budget} workers ({least.why_infeasible}); "
            f"running {least.label}, the least bad.",
        )

    cur = table.find(current) if current is not None else None
    if current is None:
        return make(
            best.configuration,
            best=best,
            cur_ms=None,
            admitted=True,
            forced=False,
            overridden=forced_mode is not None,
            reason=f"First configuration: {best.label} predicts {best.makespan_s:.1f} s on {budget} workers"
            + _vs_other_mode(table, best)
            + ".",
        )

    # 2. Overrides: forced mode different from current -> switch now.
    if forced_mode is not None and current.mode is not forced_mode:
        return make(
            best.configuration,
            best=best,
            cur_ms=cur.makespan_s if cur else None,
            admitted=True,
            forced=False,
            overridden=True,
            reason=f"Override: mode forced to {forced_mode}; {best.label} predicts {best.makespan_s:.1f} s.",
        )

    # 3. Forced switches: budget changed, or current infeasible.
    if current.total != budget:
        incumbent = _best(table, current.mode if forced_mode is None else forced_mode)
        if incumbent is None:
            return make(
                best.configuration,
                best=best,
                cur_ms=None,
                admitted=True,
                forced=True,
                overridden=forced_mode is not None,
                reason=f"Budget changed {current.total}→{budget} and no {current.mode} split is feasible; "
                f"switching to {best.label} ({best.makespan_s:.1f} s).",
            )
        if ov.freeze or incumbent.configuration == best.configuration:
            why = "frozen: keeping the mode" if ov.freeze else "best"
            return make(
                incumbent.configuration,
                best=best,
                cur_ms=incumbent.makespan_s,
                admitted=True,
                forced=True,
                overridden=ov.freeze,
                reason=f"Budget changed {current.total}→{budget}: {incumbent.label} ({why}, "
                f"{incumbent.makespan_s:.1f} s).",
            )
        gain = (incumbent.makespan_s - best.makespan_s) / incumbent.makespan_s
        if gain > th.mode_switch:
            return make(
                best.configuration,
                best=best,
                cur_ms=incumbent.makespan_s,
                admitted=True,
                forced=True,
                overridden=False,
                reason=f"Budget changed {current.total}→{budget}: switching mode to {best.label} "
                f"({best.makespan_s:.1f} s), {gain:.1%} faster than {incumbent.label} "
                f"(threshold {th.mode_switch:.1%}).",
            )
        return make(
            incumbent.configuration,
            best=best,
            cur_ms=incumbent.makespan_s,
            admitted=False,
            forced=True,
            overridden=False,
            reason=f"Budget changed {current.total}→{budget}: keeping {current.mode} as {incumbent.label} "
            f"({incumbent.makespan_s:.1f} s); {best.label} is only {gain:.1%} faster "
            f"(mode-switch threshold {th.mode_switch:.1%}).",
        )

    assert cur is not None
    if not cur.feasible:
        return make(
            best.configuration,
            best=best,
            cur_ms=cur.makespan_s,
            admitted=True,
            forced=True,
            overridden=False,
            reason=f"Current {cur.label} is infeasible ({cur.why_infeasible}); forced switch to "
            f"{best.label} ({best.makespan_s:.1f} s).",
        )
    if ov.freeze:
        return make(
            current,
            best=best,
            cur_ms=cur.makespan_s,
            admitted=False,
            forced=False,
            overridden=True,
            reason=f"Frozen by override: keeping {cur.label} ({cur.makespan_s:.1f} s; best {best.label} "
            f"{best.makespan_s:.1f} s).",
        )
    if best.configuration == current:
        return make(
            current,
            best=best,
            cur_ms=cur.makespan_s,
            admitted=True,
            forced=False,
            overridden=False,
            reason=f"{cur.label} is still the best ({cur.makespan_s:.1f} s); no change.",
        )
    gain = (cur.makespan_s - best.makespan_s) / cur.makespan_s
    threshold = th.mode_switch if best.mode is not current.mode else th.ratio_change
    kind = "mode switch" if best.mode is not current.mode else "ratio change"
    if gain > threshold:
        return make(
            best.configuration,
            best=best,
            cur_ms=cur.makespan_s,
            admitted=True,
            forced=False,
            overridden=False,
            reason=f"{kind.capitalize()} {cur.label}→{best.label}: predicted {best.makespan_s:.1f} s vs "
            f"{cur.makespan_s:.1f} s ({gain:.1%} > {threshold:.1%}).",
        )
    if best.mode is not current.mode:
        # the mode switch is not worth it; a better ratio within the current mode may still be
        same = _best(table, current.mode)
        if same is not None and same.configuration != current:
            g_same = (cur.makespan_s - same.makespan_s) / cur.makespan_s
            if g_same > th.ratio_change:
                return make(
                    same.configuration,
                    best=best,
                    cur_ms=cur.makespan_s,
                    admitted=False,
                    forced=False,
                    overridden=False,
                    reason=f"Ratio change {cur.label}→{same.label} ({g_same:.1%} > {th.ratio_change:.1%}); "
                    f"the mode switch to {best.label} gains only {gain:.1%} "
                    f"(< {th.mode_switch:.1%}).",
                )
    return make(
        current,
        best=best,
        cur_ms=cur.makespan_s,
        admitted=False,
        forced=False,
        overridden=False,
        reason=f"Keeping {cur.label}: {best.label} would gain only {gain:.1%} (< {threshold:.1%} {kind} threshold).",
    )


def _vs_other_mode(table: CandidateTable, best: Candidate) -> str:
    other = _best(table, Mode.COLOCATED if best.mode is Mode.DISAGGREGATED else Mode.DISAGGREGATED)
    if other is None:
        return ""
    return f" vs {other.makespan_s:.1f} s for the best {other.mode} ({other.label})"


# ---------------------------------------------------------------------------------------------------------
# Mixed pools: one job's rollout workers on several chip types (issue 23)


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


def _best_mixed(cands: list[Candidate], keep: Callable[[Candidate], bool] = lambda c: True) -> Candidate | None:
    ok = [c for c in cands if c.feasible and keep(c)]
    return min(ok, key=lambda c: (c.makespan_s, c.configuration.total)) if ok else None


def single_type(c: Candidate) -> bool:
    """The candidate runs on one chip type only (no cross-type split, no colocation over several types)."""
    return not c.configuration.cross_type and "+" not in c.prefill_hardware


def best_homogeneous(cands: list[Candidate]) -> Candidate | None:
    """The best candidate that runs on one chip type only (the best-homogeneous baseline's choice)."""
    return _best_mixed(cands, single_type)


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
    """Choose the rollout configuration on a mixed pool, with `decide`'s hysteresis.

    A change of counts within the same mode and chip types is a ratio change; a change of mode or of the
    chip type of either role re-roles workers like a mode switch and needs the larger threshold. When the
    current configuration is no longer a candidate (its pool changed), the best candidate of its own kind
    is the incumbent and the switch is forced, as `decide` does on a budget change. `allow` keeps only the
    candidates it accepts."""
    th = thresholds or Thresholds()
    cands = evaluate_mixed(workload, coeffs, workers, link, rule or FeasibilityRule())
    if allow is not None:  # e.g. `single_type`: the best-homogeneous baseline plans over one chip type only
        cands = [c for c in cands if allow(c)]
    best = _best_mixed(cands)

    def out(cfg: Candidate, cur_ms: float | None, admitted: bool, forced: bool, reason: str) -> MixedDecision:
        gain = 0.0
        if cur_ms is not None and best is not None and np.isfinite(cur_ms) and cur_ms > 0:
            gain = (cur_ms - best.makespan_s) / cur_ms
        return MixedDecision(
            cfg.configuration,
            tuple(cands),
            cfg.makespan_s,
            cur_ms,
            best.configuration if best else None,
            float(gain),
            admitted,
            forced,
            reason,
        )

    if best is None:
        if not cands:
            empty = Candidate.of(
                Configuration.colocated(0), float("inf"), False, 0.0, 0.0, 0.0, workload.env_time_s, "no workers"
            )
            return MixedDecision(
                empty.configuration, (), float("inf"), None, None, 0.0, True, True, "No rollout workers in the pool."
            )
        least = min(cands, key=lambda c: c.makespan_s)
        return out(
            least,
            None,
            True,
            True,
            f"No feasible configuration ({least.why_infeasible}); running {least.label}, the least bad.",
        )
    if current is None:
        homo = best_homogeneous(cands)
        vs = f" vs {homo.makespan_s:.1f} s for the best single type ({homo.label})" if homo and homo is not best else ""
        return out(best, None, True, False, f"First configuration: {best.label} predicts {best.makespan_s:.1f} s{vs}.")
    cur = next((c for c in cands if c.configuration == current), None)
    kind = (current.mode, current.prefill_hardware, current.decode_hardware)
    if cur is None or not cur.feasible:
        incumbent = _best_mixed(cands, lambda c: c.kind == kind)
        why = "is no longer a candidate on this pool" if cur is None else f"is infeasible ({cur.why_infeasible})"
        if incumbent is None or cur is not None:
            return out(
                best,
                cur.makespan_s if cur else None,
                True,
                True,
                f"Current {current.label()} {why}; switching to {best.label} ({best.makespan_s:.1f} s).",
            )
        gain = (incumbent.makespan_s - best.makespan_s) / incumbent.makespan_s
        if incumbent is best or gain <= th.mode_switch:
            return out(
                incumbent,
                incumbent.makespan_s,
                incumbent is best,
                True,
                f"Pool changed: {incumbent.label} ({incumbent.makespan_s:.1f} s) keeps the kind of "
                f"{current.label()}; {best.label} gains {gain:.1%} (threshold {th.mode_switch:.1%}).",
            )
        return out(
            best,
            incumbent.makespan_s,
            True,
            True,
            f"Pool changed: switching to {best.label} ({best.makespan_s:.1f} s), {gain:.1%} faster than "
            f"{incumbent.label} (threshold {th.mode_switch:.1%}).",
        )
    if best.configuration == current:
        return out(cur, cur.makespan_s, True, False, f"{cur.label} is still the best ({cur.makespan_s:.1f} s).")
    gain = (cur.makespan_s - best.makespan_s) / cur.makespan_s
    same_kind = best.kind == kind
    threshold = th.ratio_change if same_kind else th.mode_switch
    what = "ratio change" if same_kind else "switch of mode or chip types"
    if gain > threshold:
        return out(
            best,
            cur.makespan_s,
            True,
            False,
            f"{what.capitalize()} {cur.label}→{best.label}: {best.makespan_s:.1f} s vs {cur.makespan_s:.1f} s "
            f"({gain:.1%} > {threshold:.1%}).",
        )
    if not same_kind:
        same = _best_mixed(cands, lambda c: c.kind == kind)
        if same is not None and same.configuration != current:
            g = (cur.makespan_s - same.makespan_s) / cur.makespan_s
            if g > th.ratio_change:
                return out(
                    same,
                    cur.makespan_s,
                    False,
                    False,
                    f"Ratio change {cur.label}→{same.label} ({g:.1%} > {th.ratio_change:.1%}); "
                    f"{best.label} gains only {gain:.1%} (< {th.mode_switch:.1%}).",
                )
    return out(
        cur,
        cur.makespan_s,
        False,
        False,
        f"Keeping {cur.label}: {best.label} would gain only {gain:.1%} (< {threshold:.1%} {what} threshold).",
    )


__all__ = [
    "Candidate",
    "CandidateList",
    "CandidateTable",
    "Decision",
    "MixedCandidate",
    "MixedDecision",
    "Thresholds",
    "best_homogeneous",
    "decide",
    "decide_mixed",
    "evaluate",
    "evaluate_mixed",
    "single_type",
]
