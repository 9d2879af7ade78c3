"""What the decision engine weighs and what it records: hysteresis thresholds, the candidates (one
configuration with its predicted parts; every candidate of one decision, as a numpy-backed table on one
chip type or a list on a mixed pool) and the `Decision` the dashboard shows."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from controlplane.core.borrowing import GateResult
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
        return best_feasible(list(self.rows), lambda c: c.mode is Mode.DISAGGREGATED)

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


def best_feasible(cands: list[Candidate], keep: Callable[[Candidate], bool] = lambda c: True) -> Candidate | None:
    """The fastest feasible candidate that `keep` accepts (ties: the one with fewer workers)."""
    ok = [c for c in cands if c.feasible and keep(c)]
    return min(ok, key=lambda c: (c.makespan_s, c.configuration.total)) if ok else None


def expected_gain(current_makespan_s: float | None, best: Candidate | None) -> float:
    """(T_current − T_best)/T_current, the gain a decision records; 0 without a comparable current."""
    gain = 0.0
    if (
        current_makespan_s is not None
        and best is not None
        and np.isfinite(current_makespan_s)
        and current_makespan_s > 0
    ):
        gain = (current_makespan_s - best.makespan_s) / current_makespan_s
    return float(gain)
