"""Typed JSON messages of the agent link (`/ws/agent/`), shared by the control plane and `agents/`.

Level-triggered: the control plane always sends a node's *full* desired state with a monotonically
increasing `generation`; a reconnecting agent just receives the current desired state again. The
`epoch` is the node's fencing token: it is bumped when a lease expires, and an agent (and its
workers) must refuse any command that carries an older epoch.

Every message is a JSON object with a `type`. `parse_agent_message` / `parse_control_message` are
strict: unknown types, unknown fields or wrong types raise `LinkError` with a message naming the
field, and the consumer answers with an `error` message instead of changing anything.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from controlplane.core.state import Activity, Pool, Role
from controlplane.core.wire import bounded, parse_dataclass

MAX_MESSAGE_BYTES = 1 << 20
MAX_SLOTS = 64
MAX_WORKERS = 64
MAX_TELEMETRY_RECORDS = 2048


class LinkError(ValueError):
    """A message that does not follow the protocol."""


# ---------------------------------------------------------------- building blocks
@dataclass(frozen=True, slots=True)
class SlotSpec:
    """One logical GPU slot of a node as the agent reports it."""

    index: int
    hardware: str
    memory_mb: int


@dataclass(frozen=True, slots=True)
class ObservedWorker:
    """What the agent sees of one worker process."""

    worker_id: int
    role: Role
    activity: Activity
    state: str  # starting | running | draining | stopped | failed
    weight_version: int = 0
    endpoint: str = ""
    inflight: int = 0
    generation: int = 0  # desired-state generation the worker was last reconciled to


@dataclass(frozen=True, slots=True)
class DesiredWorker:
    """What the control plane wants one worker on this node to be."""

    worker_id: int
    gpus: list[int] = field(metadata=bounded(max_len=MAX_SLOTS))  # slot indexes on this node (G_w); fixed for life
    role: Role
    activity: Activity
    engine: str
    model: str = "tiny"
    job: str = ""
    min_weight_version: int = 0
    weights_url: str = ""


WORKER_STATES = frozenset({"starting", "running", "draining", "stopped", "failed"})


# ---------------------------------------------------------------- agent -> control plane
@dataclass(frozen=True, slots=True)
class Register:
    type: ClassVar[str] = "register"
    node: str
    pool: Pool
    hardware: str
    slots: list[SlotSpec] = field(metadata=bounded(max_len=MAX_SLOTS))
    incarnation: str  # new per agent process start (a restarted agent is a new incarnation)
    engine: str = "emulated"
    data_plane: str = ""  # base URL of the agent's data plane, if any


@dataclass(frozen=True, slots=True)
class Heartbeat:
    type: ClassVar[str] = "heartbeat"
    epoch: int
    generation: int  # last desired-state generation the agent applied
    workers: list[ObservedWorker] = field(default_factory=list, metadata=bounded(max_len=MAX_WORKERS))


@dataclass(frozen=True, slots=True)
class Telemetry:
    type: ClassVar[str] = "telemetry"
    epoch: int
    records: list[dict[str, Any]] = field(metadata=bounded(max_len=MAX_TELEMETRY_RECORDS))  # TelemetryRecord.to_json()


@dataclass(frozen=True, slots=True)
class Fault:
    type: ClassVar[str] = "fault"
    epoch: int
    worker_id: int
    kind: str  # crashed | restarted | oom | timeout
    detail: str = ""
    aborted: list[dict[str, Any]] = field(default_factory=list)  # partial outputs of aborted requests


# ---------------------------------------------------------------- control plane -> agent
@dataclass(frozen=True, slots=True)
class Registered:
    type: ClassVar[str] = "registered"
    node_id: int
    epoch: int
    lease_s: float
    heartbeat_s: float


@dataclass(frozen=True, slots=True)
class DesiredState:
    type: ClassVar[str] = "desired_state"
    generation: int
    epoch: int
    status: str  # ready | draining | not_ready | gone
    workers: list[DesiredWorker] = field(metadata=bounded(max_len=MAX_WORKERS))
    preemption_deadline: float | None = None  # unix time by which the node must be empty


@dataclass(frozen=True, slots=True)
class ErrorMessage:
    type: ClassVar[str] = "error"
    code: str
    message: str


AGENT_MESSAGES: dict[str, type] = {m.type: m for m in (Register, Heartbeat, Telemetry, Fault)}
CONTROL_MESSAGES: dict[str, type] = {m.type: m for m in (Registered, DesiredState, ErrorMessage)}


# ---------------------------------------------------------------- (de)serialisation
def dump(message: Any) -> dict[str, Any]:
    """Message dataclass -> JSON-ready dict with its `type`."""
    out = asdict(message)
    out["type"] = message.type
    return out


def parse_agent_message(data: Any) -> Register | Heartbeat | Telemetry | Fault:
    return _parse_typed(data, AGENT_MESSAGES)


def parse_control_message(data: Any) -> Registered | DesiredState | ErrorMessage:
    return _parse_typed(data, CONTROL_MESSAGES)


def _parse_typed(data: Any, table: dict[str, type]) -> Any:
    if not isinstance(data, dict):
        raise LinkError("message must be a JSON object")
    kind = data.get("type")
    cls = table.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise LinkError(f"unknown message type: {kind!r}")
    body = {k: v for k, v in data.items() if k != "type"}
    return parse_dataclass(cls, body, kind, error=LinkError, int_min=0, check=_check)


def _check(obj: Any, where: str) -> None:
    if isinstance(obj, ObservedWorker) and obj.state not in WORKER_STATES:
        raise LinkError(f"{where}.state: unknown worker state {obj.state!r}")
