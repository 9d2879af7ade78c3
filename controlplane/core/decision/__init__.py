"""PD decision engine (paper §4): mode and P:D ratio for a worker budget, with hysteresis.

On every elastic signal: enumerate N_P = 1..N_k−1 (N_D = N_k − N_P), drop infeasible splits,
compare the best disaggregated split with colocation, then admit the switch only if it beats the
current configuration by more than a threshold — larger for a mode switch than for a ratio change,
because a mode switch rebinds every worker's role, router and CUDA graphs ("tens of seconds", §4).
Forced switches (current infeasible, or its worker count no longer matches the budget) bypass the
hysteresis; manual overrides always win.

The package, by idea: `candidates` (thresholds, candidates, the `Decision` record), `rules` (a decision
as an ordered rule table: the first rule that holds decides), `homogeneous` (`evaluate`, `decide`: one
chip type) and `mixed` (`evaluate_mixed`, `decide_mixed`: a pool of several chip types, issue 23).
"""

from __future__ import annotations

from controlplane.core.decision.candidates import Candidate, CandidateList, CandidateTable, Decision, Thresholds
from controlplane.core.decision.homogeneous import decide, evaluate
from controlplane.core.decision.mixed import (
    MixedCandidate,
    MixedDecision,
    best_homogeneous,
    decide_mixed,
    evaluate_mixed,
    single_type,
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
