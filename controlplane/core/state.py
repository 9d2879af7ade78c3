"""The vocabulary of the unified GPU–worker–role map M = { w -> (G_w, R_w, a_w) } (paper Eq. 4).

These enums are shared by the database models, the agent link, the simulator and the
core algorithms so that one spelling of every state exists in the whole product.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Role(StrEnum):
    """R_w: what a worker does."""

    PREFILL = "prefill"
    DECODE = "decode"
    COLOCATED = "colocated"
    TRAINING = "training"


ROLLOUT_ROLES: tuple[Role, ...] = (Role.PREFILL, Role.DECODE, Role.COLOCATED)


class Activity(StrEnum):
    """a_w: whether a worker serves (active), is parked (inactive) or is changing (transitioning)."""

    ACTIVE = "active"
    INACTIVE = "inactive"
    TRANSITIONING = "transitioning"


class Mode(StrEnum):
    """A rollout configuration is either all-colocated or all-disaggregated."""

    COLOCATED = "colocated"
    DISAGGREGATED = "disaggregated"


class Pool(StrEnum):
    """Where a node's GPUs come from."""

    RESERVED = "reserved"  # dedicated rollout GPUs, never taken away
    ELASTIC = "elastic"  # preemptible GPUs (inter-scale elasticity)
    TRAINING = "training"  # training GPUs, borrowable between updates (intra-scale elasticity)


class Zone(StrEnum):
    """Dedicated rollout GPUs vs training GPUs shared with overlap rollout workers."""

    ROLLOUT = "rollout"
    OVERLAP = "overlap"


class NodeStatus(StrEnum):
    READY = "ready"
    NOT_READY = "not_ready"
    DRAINING = "draining"
    GONE = "gone"


class EngineKind(StrEnum):
    TORCH = "torch"
    EMULATED = "emulated"
    VLLM = "vllm"


@dataclass(frozen=True, slots=True)
class Configuration:
    """pi = (N_P, N_D, N_C): the rollout topology. Either N_C > 0 alone, or N_P >= 1 and N_D >= 1."""

    mode: Mode
    n_prefill: int = 0
    n_decode: int = 0
    n_colocated: int = 0

    def __post_init__(self) -> None:
        if min(self.n_prefill, self.n_decode, self.n_colocated) < 0:
            raise ValueError("worker counts must be >= 0")
        if self.mode is Mode.COLOCATED and (self.n_prefill or self.n_decode):
            raise ValueError("a colocated configuration has no prefill or decode workers")
        if self.mode is Mode.DISAGGREGATED:
            if self.n_colocated:
                raise ValueError("a disaggregated configuration has no colocated workers")
            if self.n_prefill < 1 or self.n_decode < 1:
                raise ValueError("a disaggregated configuration needs >= 1 prefill and >= 1 decode worker")

    @property
    def total(self) -> int:
        return self.n_prefill + self.n_decode + self.n_colocated

    @classmethod
    def colocated(cls, n: int) -> Configuration:
        return cls(Mode.COLOCATED, n_colocated=n)

    @classmethod
    def disaggregated(cls, n_prefill: int, n_decode: int) -> Configuration:
        return cls(Mode.DISAGGREGATED, n_prefill=n_prefill, n_decode=n_decode)

    def role_counts(self) -> dict[Role, int]:
        return {Role.PREFILL: self.n_prefill, Role.DECODE: self.n_decode, Role.COLOCATED: self.n_colocated}

    def label(self) -> str:
        """Paper notation: '3P5D' or '8C'."""
        if self.mode is Mode.COLOCATED:
            return f"{self.n_colocated}C"
        return f"{self.n_prefill}P{self.n_decode}D"
