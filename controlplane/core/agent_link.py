"""Typed JSON messages of the agent link (`/ws/agent/`), shared by the control plane and `agents/`.

Level-triggered: the control plane always sends a node's *full* desired state with a monotonically
increasing `generation`; a reconnecting agent just receives the current desired state again. The
`epoch` is the node's fencing token: it is bumped when a lease expires, and an agent (and its
workers) must refuse any command that carries an older epoch.

Every message is a JSON object with a `type`, written and read by the one wire codec (`core/wire`,
this link's `AGENT_LINK`): `AGENT_LINK.decode` + `AGENT_LINK.parse(data, AGENT_MESSAGES)` (or
`CONTROL_MESSAGES`) are strict: malformed or non-finite JSON, nesting deeper than `MAX_DEPTH`, strings
no database stores (NUL, lone surrogates), unknown types, unknown fields or wrong types raise
`WireError` with a message naming the field, and the consumer answers with an `ErrorReply` (spelled
`code` / `message` on this link) instead of changing anything; the link stays up.

Weights are pulled with scoped, rotating tokens (`weights_token`): an HMAC of (job, time bucket)
under a per-job key. The control plane gives the key only to the job's trainer, which verifies;
rollout workers get a token that opens that job's weights for at most three rotation periods.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from controlplane.core.state import Activity, Pool, Role
from controlplane.core.wire import ErrorReply, WireError, WireProtocol, bounded

MAX_MESSAGE_BYTES = 1 << 20
MAX_DEPTH = 16
MAX_SLOTS = 64
MAX_WORKERS = 64
MAX_TELEMETRY_RECORDS = 2048
MAX_ABORTED = 4096
MAX_VERSION = 2**31 - 1  # what the database's weight-version columns hold
WEIGHTS_TOKEN_PREFIX = "pwt_"
CLOSE_SUPERSEDED = 4409  # another socket registered for this node: this one no longer holds the lease


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
    weight_version: int = field(default=0, metadata=bounded(0, MAX_VERSION))
    endpoint: str = field(default="", metadata=bounded(max_len=200))
    inflight: int = field(default=0, metadata=bounded(0, MAX_VERSION))
    generation: int = 0  # desired-state generation the worker was last reconciled to
    devices: list[int] = field(
        default_factory=list, metadata=bounded(0, 1023, MAX_SLOTS)
    )  # CUDA_VISIBLE_DEVICES it runs with


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
    weights_url: str = ""  # the job's trainer, as the control plane records it (never as an agent claims it)
    weights_token: str = ""  # rollout workers: scoped, rotating token for the job's weights
    weights_key: str = ""  # the training worker only: the per-job key it verifies weights tokens with
    dataplane_token: str = ""  # the job's data-plane token: its rollout driver calls this worker with it
    # the training worker only (issue 36, core.checkpoints): where it exports Hugging Face checkpoints, every how
    # many updates, how many it keeps, and the checkpoint directory its policy starts from ("" = the model's)
    checkpoint_dir: str = field(default="", metadata=bounded(max_len=1100))
    checkpoint_every: int = field(default=0, metadata=bounded(0, MAX_VERSION))
    checkpoint_keep: int = field(default=0, metadata=bounded(0, MAX_VERSION))
    init_from: str = field(default="", metadata=bounded(max_len=1100))


@dataclass(frozen=True, slots=True)
class DesiredDriver:
    """A job's rollout driver this node's agent runs and restarts (it lives beside the job's trainer)."""

    job: str
    token: str  # the driver link token of that job (PEARL_DRIVER_TOKEN)


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
class TelemetryBatch:
    """A batch of a node's telemetry records (its workers' and its own)."""

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
    aborted: list[dict[str, Any]] = field(
        default_factory=list, metadata=bounded(max_len=MAX_ABORTED)
    )  # partial outputs of aborted requests


# ---------------------------------------------------------------- control plane -> agent
@dataclass(frozen=True, slots=True)
class Registered:
    type: ClassVar[str] = "registered"
    node_id: int
    epoch: int
    lease_s: float
    heartbeat_s: float
    weights_rotate_s: float = 300.0  # rotation period of weights tokens (a trainer verifies with it)


@dataclass(frozen=True, slots=True)
class DesiredState:
    type: ClassVar[str] = "desired_state"
    generation: int
    epoch: int
    status: str  # ready | draining | not_ready | gone
    workers: list[DesiredWorker] = field(metadata=bounded(max_len=MAX_WORKERS))
    preemption_deadline: float | None = None  # unix time by which the node must be empty
    drivers: list[DesiredDriver] = field(default_factory=list, metadata=bounded(max_len=MAX_WORKERS))


AGENT_MESSAGES: dict[str, type] = {m.type: m for m in (Register, Heartbeat, TelemetryBatch, Fault)}
CONTROL_MESSAGES: dict[str, type] = {m.type: m for m in (Registered, DesiredState, ErrorReply)}


# ---------------------------------------------------------------- the link's framing
def _check(obj: Any, where: str) -> None:
    if isinstance(obj, ObservedWorker) and obj.state not in WORKER_STATES:
        raise WireError(f"{where}.state: unknown worker state {obj.state!r}")


AGENT_LINK = WireProtocol(
    "agent link",
    type_last=True,  # as this link's frames were first written
    error_keys={"error": "code", "detail": "message"},
    max_bytes=MAX_MESSAGE_BYTES,
    max_depth=MAX_DEPTH,
    storable=True,
    int_min=0,
    check=_check,
)


# ---------------------------------------------------------------- scoped weights tokens
def weights_token(key: str, job: str, bucket: int) -> str:
    """The token that opens `job`'s weights during rotation period `bucket` (an HMAC under the job's key)."""
    mac = hmac.new(bytes.fromhex(key), f"{job}|{bucket}".encode(), hashlib.sha256).hexdigest()
    return f"{WEIGHTS_TOKEN_PREFIX}{bucket}.{mac}"


def token_bucket(rotate_s: float, now: float | None = None) -> int:
    return int((time.time() if now is None else now) // rotate_s)


RESEND_SPREAD = 0.5  # of a rotation period: how far apart the nodes' resends of fresh tokens are spread


def resend_bucket(rotate_s: float, node_id: int, now: float | None = None) -> int:
    """The period by which `node_id`'s desired state (its workers' fresh weights tokens) is resent: the
    period's boundary shifted by an offset under half a period, spread over node ids (golden-ratio steps),
    so a thousand sockets do not all read their desired state on the heartbeat after the same boundary. A
    token sent at any time stays valid (its period or a neighbour's) for more than half a period past
    the node's next resend."""
    offset = (node_id * 0.6180339887498949) % 1.0 * RESEND_SPREAD * rotate_s
    return token_bucket(rotate_s, (time.time() if now is None else now) - offset)


def minted_bucket(token: str) -> int | None:
    """The rotation period a weights token names (None: not a weights token's shape)."""
    if not token.startswith(WEIGHTS_TOKEN_PREFIX) or len(token) > 128:
        return None
    bucket_text, _, _ = token[len(WEIGHTS_TOKEN_PREFIX) :].partition(".")
    if not bucket_text.isascii() or not bucket_text.isdigit() or len(bucket_text) > 12:
        return None
    return int(bucket_text)


def verify_weights_token(key: str, job: str, token: str, rotate_s: float, now: float | None = None) -> bool:
    """True for a token of this job's key from the current rotation period or either neighbour
    (clock skew between nodes); constant-time."""
    bucket = minted_bucket(token)
    if not key or bucket is None or abs(bucket - token_bucket(rotate_s, now)) > 1:
        return False
    try:
        expected = weights_token(key, job, bucket)
    except ValueError:  # a key that is not hex opens nothing
        return False
    return hmac.compare_digest(token.encode(), expected.encode())
