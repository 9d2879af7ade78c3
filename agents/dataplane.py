"""Typed JSON messages of the worker data plane (driver/agent/peer -> engine worker over HTTP).

Every request and answer is one of these types, written and read by the one wire codec (`core/wire`,
this protocol's `DATA_PLANE`): the servers (`agents.worker`, `agents.trainer.server`, the weight store)
parse their bodies with `DATA_PLANE.parse(RequestType, data)` (unknown fields, wrong types and
out-of-range values raise `WireError`; the server answers 400 with an `ErrorReply`, `{"error": why}`),
and the one client family (`agents.worker_client`) builds every request from them and parses every
answer into them. Tensors never travel as JSON: KV caches and weights are safetensors bytes on their own
GET endpoints. Auth: every call carries `Authorization: Bearer <worker secret>` (the secret is
given to the worker by its agent at spawn); a KV pull may instead carry the per-handle capability
token returned by `prefill`, so a decode peer needs no other secret.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from controlplane.core.wire import WireError, WireProtocol, bounded

AUTH_HEADER = "Authorization"
KV_TOKEN_HEADER = "X-PEARL-KV-Token"
EPOCH_HEADER = "X-PEARL-Epoch"  # fencing token of control verbs; lower than the highest seen -> 409
WEIGHT_VERSION_HEADER = "X-PEARL-Weight-Version"

MAX_REQUEST_BYTES = 1 << 20  # JSON bodies to a worker
MAX_TRAINER_REQUEST_BYTES = 64 << 20  # a trainer's (a step's samples)
MAX_KV_BYTES = 1 << 30  # one pulled KV cache
MAX_WEIGHT_BYTES = 8 << 30
MAX_PROMPT_TOKENS = 32768  # Qwen3's native context, the simulator's default max_length
MAX_NEW_TOKENS = MAX_PROMPT_TOKENS  # a turn's response may fill what the context leaves
MAX_ID_LEN = 128
MAX_TEXT_CHARS = 64 * MAX_NEW_TOKENS  # a result's decoded text (a token may decode to many characters)
# listen(2)'s queue of connections not yet accepted (the kernel caps it at net.core.somaxconn). aiohttp's
# default, 128, overflows when a step's B·G trajectories (or agents) connect at once, and each dropped SYN
# is retried after a second: 1 s added to those turns (benchmarks/bench_gateway.py, 1,024 sessions).
LISTEN_BACKLOG = 4096

ROLES = ("prefill", "decode", "colocated", "training")
FINISH_REASONS = ("stop", "length", "abort")


async def read_capped(content: Any, limit: int) -> bytes:
    """Read an HTTP body to EOF, failing once it exceeds `limit` bytes (StreamReader.read(n) may
    return fewer than n bytes, so a single read is not enough)."""
    chunks, total = [], 0
    async for chunk in content.iter_chunked(1 << 20):
        total += len(chunk)
        if total > limit:
            raise WireError(f"body larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


# ------------------------------------------------------------------ requests
@dataclass(slots=True)
class SamplingParams:
    max_tokens: int = field(default=16, metadata=bounded(1, MAX_NEW_TOKENS))
    temperature: float = field(default=0.0, metadata=bounded(0.0, 10.0))  # 0 = greedy
    top_p: float = field(default=1.0, metadata=bounded(1e-6, 1.0))
    seed: int = field(default=0, metadata=bounded(0, 2**62))
    stop_at_eos: bool = True


@dataclass(slots=True)
class GenerateRequest:
    """Colocated generation (also the prefill half of a PD request, see PrefillRequest)."""

    request_id: str = field(metadata=bounded(max_len=MAX_ID_LEN))
    prompt_tokens: list[int] = field(default_factory=list, metadata=bounded(0, 2**31 - 1, MAX_PROMPT_TOKENS))
    prompt: str = field(default="", metadata=bounded(max_len=4 * MAX_PROMPT_TOKENS))
    sampling: SamplingParams = field(default_factory=SamplingParams)
    min_weight_version: int = field(default=0, metadata=bounded(0))
    job: str = field(default="", metadata=bounded(max_len=MAX_ID_LEN))


PrefillRequest = GenerateRequest  # same body; the worker keeps the KV under a handle


@dataclass(slots=True)
class DecodeRequest:
    """Continue a sequence from a KV cache that this worker pulls from the prefill worker."""

    request_id: str = field(metadata=bounded(max_len=MAX_ID_LEN))
    kv_url: str = field(metadata=bounded(max_len=2048))  # http://host:port of the prefill worker
    handle: str = field(metadata=bounded(max_len=MAX_ID_LEN))
    kv_token: str = field(default="", metadata=bounded(max_len=256))
    sampling: SamplingParams = field(default_factory=SamplingParams)
    min_weight_version: int = field(default=0, metadata=bounded(0))
    job: str = field(default="", metadata=bounded(max_len=MAX_ID_LEN))


@dataclass(slots=True)
class AbortRequest:
    request_id: str = field(metadata=bounded(max_len=MAX_ID_LEN))


@dataclass(slots=True)
class DrainRequest:
    """`wait`: stop admitting and let in-flight work finish (up to timeout_s, then abort);
    `abort`: abort now. Either way the partial outputs come back."""

    mode: str = "wait"
    timeout_s: float = field(default=30.0, metadata=bounded(0.0, 3600.0))


@dataclass(slots=True)
class SleepRequest:
    level: int = field(default=1, metadata=bounded(0, 2))


@dataclass(slots=True)
class LoadWeightsRequest:
    """Pull weights `version` (0 = latest) from a weight store (`url` = its base URL)."""

    url: str = field(metadata=bounded(max_len=2048))
    version: int = field(default=0, metadata=bounded(0))
    token: str = field(default="", metadata=bounded(max_len=256))


@dataclass(slots=True)
class SetRoleRequest:
    role: str


@dataclass(slots=True)
class ResumeRequest:
    """Re-admit requests after a drain (the worker stays warm)."""


# ------------------------------------------------------------------ results
@dataclass(slots=True)
class GenerationResult:
    request_id: str = field(metadata=bounded(max_len=MAX_ID_LEN))
    # generated tokens (for a PD request: including the prefill worker's first token)
    tokens: list[int] = field(metadata=bounded(max_len=MAX_NEW_TOKENS + 1))
    logprobs: list[float] = field(metadata=bounded(max_len=MAX_NEW_TOKENS + 1))  # per token, as sampled
    finish_reason: str = field(metadata=bounded(max_len=16))  # stop | length | abort
    prompt_len: int
    weight_version: int  # oldest weight version that produced any of these tokens
    worker_id: int = 0
    text: str = field(default="", metadata=bounded(max_len=MAX_TEXT_CHARS))


@dataclass(slots=True)
class PrefillResult:
    request_id: str
    handle: str
    kv_token: str
    prompt_len: int
    first_token: int
    first_logprob: float
    kv_bytes: int
    weight_version: int
    worker_id: int = 0


@dataclass(slots=True)
class DrainResult:
    aborted: list[GenerationResult] = field(metadata=bounded(max_len=1 << 20))
    finished_in_time: bool


@dataclass(slots=True)
class WorkerStats:
    worker_id: int
    engine: str
    role: str
    state: str  # running | draining | sleeping
    weight_version: int
    running_batch: int
    waiting: int
    decode_iterations: int
    decode_iteration_s_mean: float  # over the last window
    prefill_tokens: int
    prefill_s_total: float
    generated_tokens: int
    tokens_per_s: float  # generated tokens per second over the last window
    kv_bytes_out: int
    kv_bytes_in: int
    kv_handles: int
    epoch: int = 0


@dataclass(slots=True)
class TelemetryRecords:
    """A worker's telemetry records since it was last asked (`GET /telemetry`): `TelemetryRecord.to_json()`."""

    records: list[dict[str, Any]] = field(metadata=bounded(max_len=1 << 20))


@dataclass(slots=True)
class InflightRequests:
    """A worker's requests in flight with their partial outputs so far (`GET /inflight`; what its journal keeps)."""

    inflight: list[dict[str, Any]] = field(metadata=bounded(max_len=1 << 20))


@dataclass(slots=True)
class WeightsIndex:
    """A weight store's snapshots (`GET /weights/latest`): the latest version and every one it keeps."""

    version: int = field(metadata=bounded(0))
    versions: list[int] = field(default_factory=list, metadata=bounded(0, max_len=1 << 16))


@dataclass(slots=True)
class Health:
    ok: bool
    worker_id: int
    role: str
    state: str
    weight_version: int
    pid: int
    devices: list[int] = field(default_factory=list)  # the GPUs it runs on (its CUDA_VISIBLE_DEVICES)
    sleep_mode: str = "pause"  # what /sleep does: "levels" (vLLM sleep levels 1-2, GPUs) or "pause" (scheduler held)


# ------------------------------------------------------------------ trainer
@dataclass(slots=True)
class TrainSample:
    """One completion of a GRPO group, as the rollout produced it (behaviour log-probs included)."""

    group: str = field(metadata=bounded(max_len=MAX_ID_LEN))
    prompt_tokens: list[int] = field(metadata=bounded(0, 2**31 - 1, MAX_PROMPT_TOKENS))
    completion_tokens: list[int] = field(metadata=bounded(0, 2**31 - 1, MAX_NEW_TOKENS))
    logprobs: list[float] = field(metadata=bounded(-1e4, 0.0, MAX_NEW_TOKENS))
    reward: float = field(metadata=bounded(-1e6, 1e6))
    weight_version: int = field(metadata=bounded(0))  # oldest version that produced the completion
    temperature: float = field(default=1.0, metadata=bounded(1e-3, 10.0))
    trajectory: str = field(
        default="", metadata=bounded(max_len=MAX_ID_LEN)
    )  # turns of one trajectory share its advantage
    token_count: int = field(default=0, metadata=bounded(0, 2**31))  # an emulated model's sample: its size, no tokens


@dataclass(slots=True)
class SubmitSamples:
    samples: list[TrainSample] = field(metadata=bounded(max_len=4096))
    train: bool = True  # run a step once a full batch is queued
    step: int = field(default=-1, metadata=bounded(-1, 2**31))  # >= 0: keep them for that rollout step's update


@dataclass(slots=True)
class StepRequest:
    """Train now: on everything queued (`all`), or, for an emulated trainer, on a batch of this size
    (the rollout driver sends the counts, not the tokens, of an emulated model's samples)."""

    all: bool = False
    step: int = field(default=-1, metadata=bounded(-1, 2**31))  # >= 0: train that rollout step, once
    trajectories: list[str] = field(default_factory=list, metadata=bounded(max_len=1 << 20))  # its batch
    # finished trajectories of the step left out of it (their group lost members: `core.loop` Train.dropped)
    dropped: list[str] = field(default_factory=list, metadata=bounded(max_len=1 << 20))
    training_gpus: int = field(default=0, metadata=bounded(0, 1 << 20))
    # the weight version the loop had when it asked (the update publishes the next): a trainer at another
    # version refuses the step (409) instead of publishing a version twice; -1: not checked
    version: int = field(default=-1, metadata=bounded(-1, 2**31))


@dataclass(slots=True)
class BufferedTrajectory:
    """A finished trajectory whose samples the trainer holds for its step's update (durable on its disk)."""

    step: int = field(metadata=bounded(0, 2**31))
    trajectory: str = field(metadata=bounded(max_len=MAX_ID_LEN))
    reward: float
    weight_version: int = field(metadata=bounded(0))  # the oldest weights that generated any of its samples
    turns: int = field(default=0, metadata=bounded(0, 1 << 20))  # its samples (one per turn)


@dataclass(slots=True)
class BufferedSamples:
    """`GET /samples`: every finished trajectory of the steps not trained yet (what a restarted driver recovers)."""

    trajectories: list[BufferedTrajectory] = field(metadata=bounded(max_len=1 << 20))
    version: int


@dataclass(slots=True)
class SamplesKept:
    """`POST /samples` with a `step`: how many of the step's finished trajectories the trainer keeps now
    (`buffered`, the wire's word); not `BufferedSamples`, the trajectories themselves (`GET /samples`)."""

    buffered: int
    version: int


@dataclass(slots=True)
class SamplesQueued:
    """`POST /samples` without a step: the queue's length, and the update it ran if a batch was full."""

    queued: int
    version: int
    step: dict[str, Any] | None = None  # the trainer's UpdateStats as JSON


@dataclass(slots=True)
class UpdateAnswer:
    """`POST /step`: the version the update published; for a rollout step, whether it had run already
    (a restarted driver asking again) and which of its trajectories' samples the trainer lacked."""

    version: int
    step: dict[str, Any] | None = None  # the trainer's UpdateStats as JSON (None: nothing to train)
    already: bool = False
    missing: list[str] = field(default_factory=list, metadata=bounded(max_len=1 << 20))


@dataclass(slots=True)
class QueuedUpdateAnswer:
    """`POST /step` without a rollout step: the version after training on what was queued."""

    version: int
    step: dict[str, Any] | None = None  # the trainer's UpdateStats as JSON (None: the queue was empty)


@dataclass(slots=True)
class TrainerStats:
    """`GET /stats` of a trainer."""

    version: int
    steps: int
    stale_rejected: int
    consumed: int
    queued: int
    last: dict[str, Any] | None = None  # the last update's UpdateStats as JSON


# ------------------------------------------------------------------ the protocol's framing
def _check(obj: Any, where: str) -> None:
    if isinstance(obj, DrainRequest) and obj.mode not in ("wait", "abort"):
        raise WireError(f"{where}.mode: must be 'wait' or 'abort'")
    if isinstance(obj, SetRoleRequest) and obj.role not in ROLES:
        raise WireError(f"{where}.role: unknown role {obj.role!r}")
    if isinstance(obj, GenerateRequest):
        if not obj.request_id:
            raise WireError(f"{where}.request_id: must not be empty")
        if obj.prompt and obj.prompt_tokens:
            raise WireError(f"{where}: give prompt or prompt_tokens, not both")
    if isinstance(obj, TrainSample):
        if obj.token_count:  # an emulated model's sample: its size only
            if obj.prompt_tokens or obj.completion_tokens or obj.logprobs:
                raise WireError(f"{where}: give the tokens or token_count, not both")
        elif not obj.completion_tokens or len(obj.logprobs) != len(obj.completion_tokens):
            raise WireError(f"{where}: one log-prob per completion token, at least one token")
    if isinstance(obj, (DecodeRequest, LoadWeightsRequest)):
        url = obj.kv_url if isinstance(obj, DecodeRequest) else obj.url
        if not (url.startswith("http://") or url.startswith("https://")):
            raise WireError(f"{where}: URL must be http(s)")


# untagged (the route names the type); an error body is `{"error": why}`
DATA_PLANE = WireProtocol(
    "data plane",
    tagged=False,
    error_keys={"detail": "error"},
    max_bytes=MAX_TRAINER_REQUEST_BYTES,  # the largest body any server takes; a worker's own is MAX_REQUEST_BYTES
    max_depth=None,
    check=_check,
)
