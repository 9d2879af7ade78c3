"""Typed JSON messages of the worker data plane (driver/agent/peer -> engine worker over HTTP).

Every endpoint of `agents.worker` parses its body with `parse(RequestType, data)`: unknown fields,
wrong types and out-of-range values raise `DataPlaneError` (the worker answers 400 with the
message). Tensors never travel as JSON: KV caches and weights are safetensors bytes on their own
GET endpoints. Auth: every call carries `Authorization: Bearer <worker secret>` (the secret is
given to the worker by its agent at spawn); a KV pull may instead carry the per-handle capability
token returned by `prefill`, so a decode peer needs no other secret.
"""
from __future__ import annotations

import types
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

AUTH_HEADER = "Authorization"
KV_TOKEN_HEADER = "X-PEARL-KV-Token"
EPOCH_HEADER = "X-PEARL-Epoch"  # fencing token of control verbs; lower than the highest seen -> 409
WEIGHT_VERSION_HEADER = "X-PEARL-Weight-Version"

MAX_REQUEST_BYTES = 1 << 20  # JSON bodies
MAX_KV_BYTES = 1 << 30  # one pulled KV cache
MAX_WEIGHT_BYTES = 8 << 30
MAX_PROMPT_TOKENS = 16384
MAX_NEW_TOKENS = 8192
MAX_ID_LEN = 128

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


def _bounded(lo: float | None = None, hi: float | None = None, max_len: int | None = None) -> dict[str, Any]:
    return {"lo": lo, "hi": hi, "max_len": max_len}


# ------------------------------------------------------------------ requests
@dataclass(slots=True)
class SamplingParams:
    max_tokens: int = field(default=16, metadata=_bounded(1, MAX_NEW_TOKENS))
    temperature: float = field(default=0.0, metadata=_bounded(0.0, 10.0))  # 0 = greedy
    top_p: float = field(default=1.0, metadata=_bounded(1e-6, 1.0))
    seed: int = field(default=0, metadata=_bounded(0, 2**62))
    stop_at_eos: bool = True


@dataclass(slots=True)
class GenerateRequest:
    """Colocated generation (also the prefill half of a PD request, see PrefillRequest)."""

    request_id: str = field(metadata=_bounded(max_len=MAX_ID_LEN))
    prompt_tokens: list[int] = field(default_factory=list, metadata=_bounded(0, 2**31 - 1, MAX_PROMPT_TOKENS))
    prompt: str = field(default="", metadata=_bounded(max_len=4 * MAX_PROMPT_TOKENS))
    sampling: SamplingParams = field(default_factory=SamplingParams)
    min_weight_version: int = field(default=0, metadata=_bounded(0))
    job: str = field(default="", metadata=_bounded(max_len=MAX_ID_LEN))


PrefillRequest = GenerateRequest  # same body; the worker keeps the KV under a handle


@dataclass(slots=True)
class DecodeRequest:
    """Continue a sequence from a KV cache that this worker pulls from the prefill worker."""

    request_id: str = field(metadata=_bounded(max_len=MAX_ID_LEN))
    kv_url: str = field(metadata=_bounded(max_len=2048))  # http://host:port of the prefill worker
    handle: str = field(metadata=_bounded(max_len=MAX_ID_LEN))
    kv_token: str = field(default="", metadata=_bounded(max_len=256))
    sampling: SamplingParams = field(default_factory=SamplingParams)
    min_weight_version: int = field(default=0, metadata=_bounded(0))
    job: str = field(default="", metadata=_bounded(max_len=MAX_ID_LEN))


@dataclass(slots=True)
class AbortRequest:
    request_id: str = field(metadata=_bounded(max_len=MAX_ID_LEN))


@dataclass(slots=True)
class DrainRequest:
    """`wait`: stop admitting and let in-flight work finish (up to timeout_s, then abort);
    `abort`: abort now. Either way the partial outputs come back."""

    mode: str = "wait"
    timeout_s: float = field(default=30.0, metadata=_bounded(0.0, 3600.0))


@dataclass(slots=True)
class SleepRequest:
    level: int = field(default=1, metadata=_bounded(0, 2))


@dataclass(slots=True)
class LoadWeightsRequest:
    """Pull weights `version` (0 = latest) from a weight store (`url` = its base URL)."""

    url: str = field(metadata=_bounded(max_len=2048))
    version: int = field(default=0, metadata=_bounded(0))
    token: str = field(default="", metadata=_bounded(max_len=256))


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


# ------------------------------------------------------------------ (de)serialisation
def dump(obj: Any) -> dict[str, Any]:
    return asdict(obj)


def parse(cls: type, data: Any, where: str | None = None) -> Any:
    """Strictly build dataclass `cls` from decoded JSON."""
    where = where or cls.__name__
    if not isinstance(data, dict):
        raise DataPlaneError(f"{where}: body must be a JSON object")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise DataPlaneError(f"{where}: unknown fields {sorted(unknown)}")
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in data:
            if f.default is MISSING and f.default_factory is MISSING:
                raise DataPlaneError(f"{where}: missing field {f.name!r}")
            continue
        kwargs[f.name] = _coerce(hints[f.name], data[f.name], f"{where}.{f.name}", f.metadata)
    obj = cls(**kwargs)
    _check(obj, where)
    return obj


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
        if not obj.completion_tokens or len(obj.logprobs) != len(obj.completion_tokens):
            raise DataPlaneError(f"{where}: one log-prob per completion token, at least one token")
    if isinstance(obj, (DecodeRequest, LoadWeightsRequest)):
        url = obj.kv_url if isinstance(obj, DecodeRequest) else obj.url
        if not (url.startswith("http://") or url.startswith("https://")):
            raise DataPlaneError(f"{where}: URL must be http(s)")


def _coerce(hint: Any, value: Any, where: str, meta: Any) -> Any:
    lo, hi, max_len = (meta or {}).get("lo"), (meta or {}).get("hi"), (meta or {}).get("max_len")
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        opts = typing.get_args(hint)
        if value is None and type(None) in opts:
            return None
        return _coerce([o for o in opts if o is not type(None)][0], value, where, meta)
    if origin is list:
        if not isinstance(value, list):
            raise DataPlaneError(f"{where}: must be a list")
        if max_len is not None and len(value) > max_len:
            raise DataPlaneError(f"{where}: at most {max_len} items")
        (item,) = typing.get_args(hint)
        return [_coerce(item, v, f"{where}[{i}]", {"lo": lo, "hi": hi}) for i, v in enumerate(value)]
    if hint is bool:
        if not isinstance(value, bool):
            raise DataPlaneError(f"{where}: must be a boolean")
        return value
    if hint in (int, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (hint is int and not isinstance(value, int)):
            raise DataPlaneError(f"{where}: must be {'an integer' if hint is int else 'a number'}")
        if value != value or value in (float("inf"), float("-inf")):
            raise DataPlaneError(f"{where}: must be finite")
        if lo is not None and value < lo:
            raise DataPlaneError(f"{where}: must be >= {lo}")
        if hi is not None and value > hi:
            raise DataPlaneError(f"{where}: must be <= {hi}")
        return hint(value)
    if hint is str:
        if not isinstance(value, str):
            raise DataPlaneError(f"{where}: must be a string")
        if len(value) > (max_len or 4096):
            raise DataPlaneError(f"{where}: too long")
        return value
    if isinstance(hint, type) and hasattr(hint, "__dataclass_fields__"):
        return parse(hint, value, where)
    raise DataPlaneError(f"{where}: unsupported field type")  # pragma: no cover


# ------------------------------------------------------------------ trainer
@dataclass(slots=True)
class TrainSample:
    """One completion of a GRPO group, as the rollout produced it (behaviour log-probs included)."""

    group: str = field(metadata=_bounded(max_len=MAX_ID_LEN))
    prompt_tokens: list[int] = field(metadata=_bounded(0, 2**31 - 1, MAX_PROMPT_TOKENS))
    completion_tokens: list[int] = field(metadata=_bounded(0, 2**31 - 1, MAX_NEW_TOKENS))
    logprobs: list[float] = field(metadata=_bounded(-1e4, 0.0, MAX_NEW_TOKENS))
    reward: float = field(metadata=_bounded(-1e6, 1e6))
    weight_version: int = field(metadata=_bounded(0))  # oldest version that produced the completion
    temperature: float = field(default=1.0, metadata=_bounded(1e-3, 10.0))


@dataclass(slots=True)
class SubmitSamples:
    samples: list[TrainSample] = field(metadata=_bounded(max_len=4096))
    train: bool = True  # run a step once a full batch is queued
