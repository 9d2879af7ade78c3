"""What every policy shares: the action it answers with, the interface, user-settable options and the
tracked base class (a RuntimeTracker fed by `observe`), plus the predictor helpers the policies use."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, ClassVar, Literal, Protocol

from controlplane.core.context import PolicyContext
from controlplane.core.decision import Decision, decide
from controlplane.core.predictor import WorkloadProfile
from controlplane.core.profiles import EngineCoefficients, Profile
from controlplane.core.state import Configuration
from controlplane.core.telemetry import TelemetryRecord
from controlplane.core.tracker import MAKESPAN_ERROR, FittedProfile, RuntimeTracker


@dataclass(frozen=True, slots=True)
class PolicyAction:
    target: Configuration  # over dedicated + borrowed workers
    borrow: int  # overlap workers to use as rollout workers
    decision: Decision  # explains the choice
    free_reconfiguration: bool = False  # the executor applies it at zero cost (TrackedPolicy.free_reconfiguration)


class Policy(Protocol):
    @property
    def name(self) -> str: ...

    def on_event(self, ctx: PolicyContext) -> PolicyAction: ...

    def observe(self, record: TelemetryRecord) -> None: ...

    def state(self) -> dict[str, Any]: ...

    def load_state(self, state: Mapping[str, Any]) -> None: ...


class OptionError(ValueError):
    """A policy option is unknown or out of bounds; `option` names it."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option


@dataclass(frozen=True, slots=True)
class OptionSpec:
    """One user-settable policy option (per job in the live system, per variant in a scenario)."""

    name: str
    kind: type  # int | float | bool
    default: Any
    help: str
    minimum: float | None = None
    maximum: float | None = None

    def parse(self, value: Any) -> Any:
        """Strict: JSON types only, bounds checked; OptionError names the option and the problem."""

        def bad(why: str) -> OptionError:
            return OptionError(self.name, f"policy option {self.name} {why}")

        if value is None:
            if self.default is None:
                return None
            raise bad("may not be null")
        if self.kind is bool:
            if not isinstance(value, bool):
                raise bad("must be true or false")
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad("must be a number")
        if not math.isfinite(float(value)):
            raise bad("must be finite")
        if self.kind is int and not float(value).is_integer():
            raise bad("must be an integer")
        v = self.kind(value)
        if self.minimum is not None and v < self.minimum:
            raise bad(f"must be >= {self.minimum:g}")
        if self.maximum is not None and v > self.maximum:
            raise bad(f"must be <= {self.maximum:g}")
        return v


class StaticPool(StrEnum):
    """How a static-pool policy sizes its pool (a static pool has nothing to re-plan)."""

    RESERVED = "reserved"  # the reserved (never preempted) rollout GPUs
    TRACE_MEAN = "trace-mean"  # the availability trace's mean rounded up to TP, held constant by the world


Dispatch = Literal["sticky", "jsq"]  # `core.loop.LoopConfig.dispatch`


class TrackedPolicy:
    """Shared by every policy: a RuntimeTracker fed by observe().

    The class attributes are the policy's traits: the live control plane, the simulator and the reports
    read what a policy does from them and never compare its name."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    product: ClassVar[bool] = True  # False: a reference for reports, not runnable as a job's policy
    listed: ClassVar[bool] = True  # in the catalog (API, job form, CLI) and a scenario's default policies
    options: ClassVar[tuple[OptionSpec, ...]] = ()
    static_pool: ClassVar[StaticPool | None] = None  # None: the pool follows the signals
    # how the loop routes a trajectory's turns: "sticky" (its home worker, PEARL's), "jsq" (join the shortest
    # queue with delayed dispatch at the throughput-plateau batch: RLBoost's Algorithm 2)
    dispatch: ClassVar[Dispatch] = "sticky"
    free_reconfiguration: ClassVar[bool] = False  # its plans are applied at zero cost (and it sees the future)
    chooses_by_simulation: ClassVar[bool] = False  # the simulator forks itself to choose for it (sim/oracle.py)
    color: ClassVar[str | None] = None  # in the simulator's reports (None: plotly's default)
    mixed_pools_only: ClassVar[bool] = False  # a reference that differs from another policy only on mixed pools

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        """Cross-option rules beyond each OptionSpec's bounds (OptionError names the option)."""

    def __init__(
        self,
        *,
        profile: Profile,
        batch_size: int,
        workload: WorkloadProfile | None = None,
        tracker: RuntimeTracker | None = None,
        max_trajectory_tokens: int | None = None,
    ) -> None:
        if batch_size <= 0:
            raise ValueError("batch_size must be > 0")
        self.profile = profile
        self.batch_size = batch_size
        self.tracker = tracker or RuntimeTracker(
            profile, workload, batch_size=batch_size, max_trajectory_tokens=max_trajectory_tokens
        )
        self.last_action: PolicyAction | None = None

    def on_event(self, ctx: PolicyContext) -> PolicyAction:
        raise NotImplementedError

    def observe(self, record: TelemetryRecord) -> None:
        self.tracker.observe(record)

    def state(self) -> dict[str, Any]:
        """What the policy carries from one signal to the next beyond its telemetry (JSON). The live
        planner rebuilds a policy per signal from stored telemetry and this; the simulator keeps one."""
        return {}

    def load_state(self, state: Mapping[str, Any]) -> None:
        return None

    def fitted(self, ctx: PolicyContext) -> tuple[WorkloadProfile, EngineCoefficients, FittedProfile]:
        fp = self.tracker.fitted()
        w = fp.workload
        if ctx.batch_size > 0 and ctx.batch_size != w.batch_size:
            w = replace(w, batch_size=ctx.batch_size)
        return w, fp.coefficients, fp

    def _dedicated(self, ctx: PolicyContext) -> int:
        return ctx.dedicated_workers if ctx.overrides.elasticity else min(ctx.reserved_workers, ctx.dedicated_workers)

    def _act(self, target: Configuration, borrow: int, decision: Decision) -> PolicyAction:
        action = PolicyAction(
            target=target, borrow=borrow, decision=decision, free_reconfiguration=self.free_reconfiguration
        )
        self.last_action = action
        return action


def with_inputs(decision: Decision, **inputs: Any) -> Decision:
    return replace(decision, inputs={**decision.inputs, **inputs})


def best_makespan(w: WorkloadProfile, c: EngineCoefficients, n: int) -> float:
    if n <= 0:
        return math.inf
    return decide(w, c, n).predicted_makespan_s


def best_step_time(
    w: WorkloadProfile,
    c: EngineCoefficients,
    n: int,
    update_s: float,
    *,
    max_staleness: int = 1,
    error: float = MAKESPAN_ERROR,
) -> float:
    """The step time n rollout workers give a job, as the cluster arbiter weighs them. Off-policy by a step or
    more, a rollout overlaps the previous update: the longer of the two, expected over the predicted makespan's
    relative `error` (the job's own, `FittedProfile.makespan_error`; `expected_max`: near the update's length a
    worker still shortens the steps whose rollout runs over it; with a plain max a job predicted just under its
    update gained nothing from another worker, and in the draw 2jobs-s103 it gave its share away on a 451 s
    prediction of a 520 s rollout). On-policy (`max_staleness` 0) it waits for the update: their sum.
    `update_s` is 0 until the job has trained."""
    makespan = best_makespan(w, c, n)
    if max_staleness == 0:
        return makespan + update_s
    return expected_max(makespan, update_s, error * makespan)


def expected_max(mean: float, bound: float, sd: float) -> float:
    """E[max(X, bound)] for X normal with this mean and standard deviation (the plain max where sd is 0)."""
    d = (mean - bound) / sd if sd > 0 and math.isfinite(mean) else math.inf
    if abs(d) > 6:  # the other side adds under 1e-9 of sd
        return max(mean, bound)
    return (
        bound + (mean - bound) * 0.5 * math.erfc(-d / math.sqrt(2)) + sd * math.exp(-d * d / 2) / math.sqrt(2 * math.pi)
    )
