"""What a policy sees at an elastic signal: the signal, the worker budget and the manual overrides.

Its own module so that the decision engine (`decision/`) and the policies (`policies/`) both
import it and neither imports the other's callers: no import cycle inside core.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from controlplane.core.state import Configuration


class Signal(StrEnum):
    """The elastic signals of the paper (§2): every one runs budget -> decide -> plan -> execute."""

    STEP_START = "step_start"  # a new rollout batch starts
    TRAINING_BEGIN = "training_begin"  # borrowed GPUs must go back (mandatory, deadline)
    TRAINING_FINISHED = "training_finished"  # training GPUs may be borrowed again
    CAPACITY_CHANGE = "capacity_change"  # preemptible GPUs joined or left
    PERIODIC = "periodic"  # re-evaluation tick (e.g. the borrow gate as R shrinks)


@dataclass(frozen=True, slots=True)
class Overrides:
    """Manual policy overrides; they always win over the decision engine."""

    force_mode: str | None = None  # "colocated" | "disaggregated"
    force_ratio: tuple[int, int] | None = None  # (N_P, N_D): a ratio scaled to the budget (decision.homogeneous)...
    exact_ratio: bool = False  # ...or, when True, exact worker counts (spare workers stay unused)
    freeze: bool = False  # keep the current configuration unless it is infeasible
    borrowing: bool = True  # False: never borrow training GPUs
    elasticity: bool = True  # False: ignore preemptible GPUs beyond the reserved pool
    # a configuration label that names chip types ('3P(H800) 5D(H20)'): on a mixed pool, run exactly it (the
    # oracle's choice); None: no such override
    force_configuration: str | None = None


@dataclass(frozen=True, slots=True)
class AvailabilityPoint:
    time_s: float
    dedicated_workers: int


@dataclass(frozen=True, slots=True)
class PolicyContext:
    now_s: float
    signal: Signal
    dedicated_workers: int  # rollout-zone workers available now (reserved + elastic GPUs // TP)
    reserved_workers: int  # of which never preempted
    overlap_workers: int  # training-GPU workers that could be borrowed now (0 while training runs)
    training_active: bool
    current: Configuration | None  # configuration now serving (None before the first step)
    borrowed: int  # overlap workers currently borrowed
    batch_size: int  # B
    remaining: int  # R: unfinished trajectories of the current step
    overrides: Overrides = field(default_factory=Overrides)
    future: Sequence[AvailabilityPoint] = ()  # only the oracle may read this
    # Mixed pools (issue 23): dedicated workers per chip type and the overlap workers' chip; empty / "" on a
    # pool whose units name no chip (one hardware: every homogeneous job, as before)
    hardware: tuple[tuple[str, int], ...] = ()
    overlap_hardware: str = ""
    # worker slot -> chip type of every worker in service (routes engine telemetry to its type's tracker)
    worker_hardware: tuple[tuple[int, str], ...] = ()

    @property
    def mixed(self) -> bool:
        """The pool names chip types (its units carry their hardware)."""
        return bool(self.hardware) or bool(self.overlap_hardware)


__all__ = ["AvailabilityPoint", "Overrides", "PolicyContext", "Signal"]
