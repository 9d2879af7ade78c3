"""The vocabulary of the unified GPU–worker–role map M = { w -> (G_w, R_w, a_w) } (paper Eq. 4).

These enums are shared by the database models, the agent link, the simulator and the
core algorithms so that one spelling of every state exists in the whole product.
"""

from __future__ import annotations

import re
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


_LABEL_C = re.compile(r"(\d+)C(?:\(([\w+]+)\))?")  # '8C(H20+H800)': colocated over several types
_LABEL_PD = re.compile(r"(\d+)P(\d+)D(?:\((\w+)\))?")
_LABEL_CROSS = re.compile(r"(\d+)P\((\w+)\)\s+(\d+)D\((\w+)\)")


@dataclass(frozen=True, slots=True)
class Configuration:
    """pi = (N_P, N_D, N_C): the rollout topology. Either N_C > 0 alone, or N_P >= 1 and N_D >= 1.

    On a mixed pool the configuration names the chip types it runs on: `prefill_hardware` for the prefill
    (or colocated) workers, `decode_hardware` for the decode workers; "" (the default) means the job's one
    hardware, as on a homogeneous pool, so every homogeneous configuration is what it always was."""

    mode: Mode
    n_prefill: int = 0
    n_decode: int = 0
    n_colocated: int = 0
    prefill_hardware: str = ""
    decode_hardware: str = ""

    def __post_init__(self) -> None:
        if min(self.n_prefill, self.n_decode, self.n_colocated) < 0:
            raise ValueError("worker counts must be >= 0")
        if self.mode is Mode.COLOCATED and (self.n_prefill or self.n_decode):
            raise ValueError("a colocated configuration has no prefill or decode workers")
        if self.mode is Mode.COLOCATED and self.prefill_hardware != self.decode_hardware:
            raise ValueError("a colocated configuration runs on one hardware type")
        if self.mode is Mode.DISAGGREGATED:
            if self.n_colocated:
                raise ValueError("a disaggregated configuration has no colocated workers")
            if self.n_prefill < 1 or self.n_decode < 1:
                raise ValueError("a disaggregated configuration needs >= 1 prefill and >= 1 decode worker")
        if bool(self.prefill_hardware) != bool(self.decode_hardware):
            raise ValueError("name both hardware types or neither")

    @property
    def total(self) -> int:
        return self.n_prefill + self.n_decode + self.n_colocated

    @property
    def cross_type(self) -> bool:
        """Prefill on one chip type, decode on another."""
        return self.prefill_hardware != self.decode_hardware

    @classmethod
    def colocated(cls, n: int, hardware: str = "") -> Configuration:
        return cls(Mode.COLOCATED, n_colocated=n, prefill_hardware=hardware, decode_hardware=hardware)

    @classmethod
    def disaggregated(
        cls, n_prefill: int, n_decode: int, prefill_hardware: str = "", decode_hardware: str | None = None
    ) -> Configuration:
        dec = prefill_hardware if decode_hardware is None else decode_hardware
        return cls(Mode.DISAGGREGATED, n_prefill, n_decode, 0, prefill_hardware, dec)

    @classmethod
    def parse(cls, label: str) -> Configuration:
        """The inverse of `label()`: '8C', '3P5D', '8C(H800)', '3P5D(H20)', '3P(H800) 5D(H20)'."""
        text = str(label).strip()
        if m := _LABEL_C.fullmatch(text):
            return cls.colocated(int(m[1]), m[2] or "")
        if m := _LABEL_PD.fullmatch(text):
            return cls.disaggregated(int(m[1]), int(m[2]), m[3] or "")
        if m := _LABEL_CROSS.fullmatch(text):
            return cls.disaggregated(int(m[1]), int(m[3]), m[2], m[4])
        raise ValueError(f"not a configuration label: {label!r} (e.g. '8C', '3P5D', '3P(H800) 5D(H20)')")

    def role_counts(self) -> dict[Role, int]:
        return {Role.PREFILL: self.n_prefill, Role.DECODE: self.n_decode, Role.COLOCATED: self.n_colocated}

    def label(self) -> str:
        """Paper notation: '3P5D' or '8C'; on a mixed pool with the types: '3P5D(H800)', '3P(H800) 5D(H20)'."""
        if self.mode is Mode.COLOCATED:
            base = f"{self.n_colocated}C"
        elif self.cross_type:
            return f"{self.n_prefill}P({self.prefill_hardware}) {self.n_decode}D({self.decode_hardware})"
        else:
            base = f"{self.n_prefill}P{self.n_decode}D"
        return f"{base}({self.prefill_hardware})" if self.prefill_hardware else base
