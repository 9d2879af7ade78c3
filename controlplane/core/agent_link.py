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

import types
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, ClassVar

from controlplane.core.state import Activity, Pool, Role

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
    gpus: list[int]  # slot indexes on this node (G_w); fixed for the worker's life
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
    slots: list[SlotSpec]
    incarnation: str  # new per agent process start (a restarted agent is a new incarnation)
    engine: str = "emulated"
    data_plane: str = ""  # base URL of the agent's data plane, if any


@dataclass(frozen=True, slots=True)
class Heartbeat:
    type: ClassVar[str] = "heartbeat"
    epoch: int
    generation: int  # last desired-state generation the agent applied
    workers: list[ObservedWorker] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Telemetry:
    type: ClassVar[str] = "telemetry"
    epoch: int
    records: list[dict[str, Any]]  # controlplane.core.telemetry.TelemetryRecord.to_json() objects


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
    workers: list[DesiredWorker]
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
    return _build(cls, body, kind)


_LIMITS = {"slots": MAX_SLOTS, "workers": MAX_WORKERS, "records": MAX_TELEMETRY_RECORDS, "aborted": 4096, "gpus": MAX_SLOTS}


def _build(cls: type, body: Any, where: str) -> Any:
    if not isinstance(body, dict):
        raise LinkError(f"{where}: must be a JSON object")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in fields(cls)}
    unknown = set(body) - names
    if unknown:
        raise LinkError(f"{where}: unknown fields {sorted(unknown)}")
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in body:
            if f.default is MISSING and f.default_factory is MISSING:
                raise LinkError(f"{where}: missing field {f.name!r}")
            continue
        kwargs[f.name] = _coerce(hints[f.name], body[f.name], f"{where}.{f.name}")
    result = cls(**kwargs)
    if isinstance(result, ObservedWorker) and result.state not in WORKER_STATES:
        raise LinkError(f"{where}.state: unknown worker state {result.state!r}")
    return result


def _coerce(hint: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        inner = [o for o in options if o is not type(None)][0]
        return _coerce(inner, value, where)
    if origin is list:
        if not isinstance(value, list):
            raise LinkError(f"{where}: must be a list")
        limit = _LIMITS.get(where.rsplit(".", 1)[-1], 4096)
        if len(value) > limit:
            raise LinkError(f"{where}: at most {limit} items")
        (item,) = typing.get_args(hint)
        return [_coerce(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise LinkError(f"{where}: must be an object")
        return value
    if isinstance(hint, type) and issubclass(hint, (Role, Activity, Pool)):
        try:
            return hint(value)
        except ValueError as exc:
            raise LinkError(f"{where}: unknown value {value!r}") from exc
    if hint is bool:
        if not isinstance(value, bool):
            raise LinkError(f"{where}: must be a boolean")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise LinkError(f"{where}: must be an integer")
        if value < 0:
            raise LinkError(f"{where}: must be >= 0")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise LinkError(f"{where}: must be a number")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise LinkError(f"{where}: must be a string")
        if len(value) > 4096:
            raise LinkError(f"{where}: too long")
        return value
    if hint is Any:
        return value
    if isinstance(hint, type) and hasattr(hint, "__dataclass_fields__"):
        return _build(hint, value, where)
    raise LinkError(f"{where}: unsupported field type")  # pragma: no cover - protocol definition error

