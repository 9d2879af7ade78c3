"""Typed JSON messages of the worker data plane (driver/agent/peer -> engine worker over HTTP).

Every endpoint of `agents.worker` parses its body with `parse(RequestType, data)`: unknown fields,
wrong types and out-of-range values raise `DataPlaneError` (the worker answers 400 with the
message). Tensors never travel as JSON: KV caches and weights are safetensors bytes on their own
GET endpoints. Auth: every call carries `Authorization: Bearer <worker secret>` (the secret is
given to the worker by its agent at spawn); a KV pull may instead carry the per-handle capability
token returned by `prefill`, so a decode peer needs no other secret.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from controlplane.core.wire import bounded, parse_dataclass, to_json

AUTH_HEADER = "Authorization"
KV_TOKEN_HEADER = "X-PEARL-KV-Token"
EPOCH_HEADER = "X-PEARL-Epoch"  # fencing token of control verbs; lower than the highest seen -> 409
WEIGHT_VERSION_HEADER = "X-PEARL-Weight-Version"

MAX_REQUEST_BYTES = 1 << 20  # JSON bodies
MAX_KV_BYTES = 1 << 30  # one pulled KV cache
MAX_WEIGHT_BYTES = 8 << 30
MAX_PROMPT_TOKENS = 32768  # Qwen3's native context, the simulator's default max_length
MAX_NEW_TOKENS = MAX_PROMPT_TOKENS  # a turn's response may fill what the context leaves
MAX_ID_LEN = 128
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
            raise DataPlaneError(f"body larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


class DataPlaneError(ValueError):
    """A request that does not follow the data-plane protocol (-> HTTP 400)."""


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
    request_id: str
    tokens: list[int]  # generated tokens (for a PD request: including the prefill worker's first token)
    logprobs: list[float]  # per generated token, under the sampling distribution
    finish_reason: str  # stop | length | abort
    prompt_len: int
    weight_version: int  # oldest weight version that produced any of these tokens
    worker_id: int = 0
    text: str = ""


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
    aborted: list[GenerationResult]
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
class Health:
    ok: bool
    worker_id: int
    role: str
    state: str
    weight_version: int
    pid: int
    devices: list[int] = field(default_factory=list)  # the GPUs it runs on (its CUDA_VISIBLE_DEVICES)
    sleep_mode: str = "pause"  # what /sleep does: "levels" (vLLM sleep levels 1-2, GPUs) or "pause" (scheduler held)


# ------------------------------------------------------------------ (de)serialisation
def dump(obj: Any) -> dict[str, Any]:
    return to_json(obj)


def parse(cls: type, data: Any, where: str | None = None) -> Any:
    """Strictly build dataclass `cls` from decoded JSON (the shared wire parser, DataPlaneError)."""
    return parse_dataclass(cls, data, where or cls.__name__, error=DataPlaneError, check=_check)


def _check(obj: Any, where: str) -> None:
    if isinstance(obj, DrainRequest) and obj.mode not in ("wait", "abort"):
        raise DataPlaneError(f"{where}.mode: must be 'wait' or 'abort'")
    if isinstance(obj, SetRoleRequest) and obj.role not in ROLES:
        raise DataPlaneError(f"{where}.role: unknown role {obj.role!r}")
    if isinstance(obj, GenerateRequest):
        if not obj.request_id:
            raise DataPlaneError(f"{where}.request_id: must not be empty")
        if obj.prompt and obj.prompt_tokens:
            raise DataPlaneError(f"{where}: give prompt or prompt_tokens, not both")
    if isinstance(obj, TrainSample):
        if obj.token_count:  # an emulated model's sample: its size only
            if obj.prompt_tokens or obj.completion_tokens or obj.logprobs:
                raise DataPlaneError(f"{where}: give the tokens or token_count, not both")
        elif not obj.completion_tokens or len(obj.logprobs) != len(obj.completion_tokens):
            raise DataPlaneError(f"{where}: one log-prob per completion token, at least one token")
    if isinstance(obj, (DecodeRequest, LoadWeightsRequest)):
        url = obj.kv_url if isinstance(obj, DecodeRequest) else obj.url
        if not (url.startswith("http://") or url.startswith("https://")):
            raise DataPlaneError(f"{where}: URL must be http(s)")


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
