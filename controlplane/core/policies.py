"""Rollout scheduling policies behind one interface, used unchanged by the live control plane and
the simulator (`controlplane.sim`).

INTERFACE CONTRACT (owned by the core package; the simulator and the Django services depend on it):

    policy = make_policy("pearl" | "fixed" | "fixed-large" | "elastic" | "oracle", **options)
    action = policy.on_event(ctx)          # on every elastic signal / budget change
    policy.observe(record)                 # feed a TelemetryRecord (runtime tracker input)

`PolicyContext` describes the world at an elastic signal; `PolicyAction` is what the policy wants:
a target Configuration over the workers it will use (dedicated + borrowed overlap workers), how many
overlap (training-GPU) workers to borrow, and the Decision that explains it.

Implementations are filled in by the PEARL core work (issue "PEARL core").
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, Sequence

from controlplane.core.state import Configuration
from controlplane.core.telemetry import TelemetryRecord


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
    force_ratio: tuple[int, int] | None = None  # (N_P, N_D)
    freeze: bool = False  # keep the current configuration unless it is infeasible
    borrowing: bool = True  # False: never borrow training GPUs
    elasticity: bool = True  # False: ignore preemptible GPUs beyond the reserved pool


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


@dataclass(frozen=True, slots=True)
class PolicyAction:
    target: Configuration  # over dedicated + borrowed workers
    borrow: int  # overlap workers to use as rollout workers
    decision: object  # controlplane.core.decision.Decision explaining the choice
    free_reconfiguration: bool = False  # oracle only: the executor applies it at zero cost


class Policy(Protocol):
    name: str

    def on_event(self, ctx: PolicyContext) -> PolicyAction: ...

    def observe(self, record: TelemetryRecord) -> None: ...
