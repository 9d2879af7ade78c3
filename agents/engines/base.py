"""The one Engine interface behind every worker (torch, emulated, vllm) and what they share.

Control verbs follow vLLM's: sleep/wake, load weights (a version), pause (drain) / resume, abort
with partial outputs. Roles change in place (`set_role`) without a restart or a weight reload, as in
vLLM's runtime PD role switch: a role only decides which requests are admitted.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import secrets
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from agents.dataplane import (
    DecodeRequest,
    GenerateRequest,
    GenerationResult,
    PrefillResult,
    WorkerStats,
)
from agents.tokenizer import TOKENIZER, Tokenizer
from controlplane.core import telemetry as tm
from controlplane.core.telemetry import TelemetryRecord

TELEMETRY_BUFFER = 4096
# One decode-iteration sample per this many wall seconds per engine: the tracker fits iteration time
# against batch size from a bounded window, and an engine iterating every few milliseconds would
# otherwise write hundreds of rows a second to the control plane's database.
DECODE_SAMPLE_S = 1.0
KV_LEASE_S = 60.0  # an unpulled KV handle is freed after this (vLLM's kv_lease_duration is 30 s)


class EngineError(Exception):
    """An error with the HTTP status the worker answers with."""

    status = 400

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status


class EngineNotFound(EngineError):
    status = 404


class EngineConflict(EngineError):
    status = 409


class EngineUnavailable(EngineError):
    status = 503


ADMITS = {
    "prefill": {"prefill"},
    "decode": {"decode"},
    "colocated": {"generate", "prefill", "decode"},  # a colocated worker can also stand in for either half
    "training": set(),
}


@dataclass
class KVEntry:
    data: bytes
    token: str
    created: float
    tokens: int


class KVStore:
    """Prefilled KV caches waiting to be pulled by a decode worker. Pull-once, lease-limited."""

    def __init__(self, lease_s: float = KV_LEASE_S, max_bytes: int = 2 << 30) -> None:
        self.lease_s = lease_s
        self.max_bytes = max_bytes
        self._entries: dict[str, KVEntry] = {}
        self.bytes_out = 0

    def put(self, data: bytes, tokens: int) -> tuple[str, str]:
        self.expire()
        if sum(len(e.data) for e in self._entries.values()) + len(data) > self.max_bytes:
            raise EngineUnavailable("KV store full: decode workers are not pulling")
        handle, token = secrets.token_hex(12), secrets.token_urlsafe(24)
        self._entries[handle] = KVEntry(data, token, time.monotonic(), tokens)
        return handle, token

    def pop(self, handle: str, token: str | None) -> KVEntry:
        """`token` None means the caller holds the worker secret; else it must match the handle's."""
        self.expire()
        entry = self._entries.get(handle)
        if entry is None:
            raise EngineNotFound(f"unknown KV handle {handle!r} (never created, already pulled or expired)")
        if token is not None and not secrets.compare_digest(token, entry.token):
            raise EngineError("bad KV token for this handle", 403)
        del self._entries[handle]
        self.bytes_out += len(entry.data)
        return entry

    def expire(self) -> None:
        now = time.monotonic()
        for h in [h for h, e in self._entries.items() if now - e.created > self.lease_s]:
            del self._entries[h]

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


@dataclass
class Counters:
    decode_iterations: int = 0
    prefill_tokens: int = 0
    prefill_s_total: float = 0.0
    generated_tokens: int = 0
    kv_bytes_in: int = 0
    iteration_s: collections.deque = field(default_factory=lambda: collections.deque(maxlen=256))
    token_times: collections.deque = field(default_factory=lambda: collections.deque(maxlen=256))  # (t, n)

    def tokens_per_s(self) -> float:
        if len(self.token_times) < 2:
            return 0.0
        span = self.token_times[-1][0] - self.token_times[0][0]
        n = sum(k for _, k in list(self.token_times)[1:])
        return n / span if span > 0 else 0.0


class Engine(ABC):
    """A rollout engine inside one worker process. All methods run on the worker's event loop."""

    kind = "base"

    def __init__(self, *, worker_id: int = 0, role: str = "colocated", job: str = "") -> None:
        self.worker_id = worker_id
        self.role = role
        self.job = job
        self.weight_version = 0
        self.state = "running"  # running | draining | sleeping
        self.kv = KVStore()
        self.counters = Counters()
        self.telemetry: collections.deque[TelemetryRecord] = collections.deque(maxlen=TELEMETRY_BUFFER)
        self._decode_sampled = float("-inf")
        self.decode_sample_s = DECODE_SAMPLE_S
        self.hardware = ""  # the chip its engine records name (an engine that knows it sets it): per-type tracking
        self.tokenizer: Tokenizer = TOKENIZER  # text prompts and results; an engine of a model directory sets its own

    def record_decode_iteration(self, batch: int, duration_s: float) -> None:
        """Keep one decode iteration (batch size, model-time duration) every `decode_sample_s`: a
        systematic sample, unbiased for the tracker's fit of iteration time against batch size."""
        now = time.monotonic()
        if now - self._decode_sampled >= self.decode_sample_s:
            self._decode_sampled = now
            self.telemetry.append(
                tm.decode_iteration(
                    time_s=time.time(),
                    job=self.job,
                    worker=self.worker_id,
                    hardware=self.hardware,
                    running_batch=batch,
                    duration_s=duration_s,
                )
            )

    # ---- lifecycle
    async def start(self) -> None:  # noqa: B027 (a default no-op hook that engines may override, not abstract)
        """Start background loops (called once the event loop runs)."""

    async def shutdown(self) -> None:  # noqa: B027 (a default no-op hook that engines may override, not abstract)
        """Stop loops; in-flight work is aborted first by the caller (drain)."""

    # ---- admission
    def admit(self, verb: str, min_weight_version: int = 0) -> None:
        if self.state == "sleeping":
            raise EngineUnavailable("worker is asleep")
        if self.state == "draining":
            raise EngineUnavailable("worker is draining")
        if verb not in ADMITS.get(self.role, set()):
            raise EngineConflict(f"a {self.role} worker does not serve {verb}")
        if min_weight_version > self.weight_version:
            raise EngineConflict(f"worker holds weight version {self.weight_version} < required {min_weight_version}")

    def set_role(self, role: str) -> None:
        """In place: no restart, no weight reload. In-flight sequences finish under the old role."""
        self.role = role

    def resume(self) -> None:
        if self.state == "draining":
            self.state = "running"

    # ---- data plane
    @abstractmethod
    async def generate(self, req: GenerateRequest, prompt: list[int]) -> GenerationResult: ...

    @abstractmethod
    async def prefill(self, req: GenerateRequest, prompt: list[int]) -> PrefillResult: ...

    @abstractmethod
    async def decode(self, req: DecodeRequest, kv_bytes: bytes) -> GenerationResult: ...

    def pull_kv(self, handle: str, token: str | None) -> bytes:
        return self.kv.pop(handle, token).data

    @abstractmethod
    async def abort(self, request_id: str) -> GenerationResult | None: ...

    @abstractmethod
    async def abort_all(self) -> list[GenerationResult]: ...

    @abstractmethod
    def inflight(self) -> list[dict[str, Any]]:
        """Partial outputs of every in-flight request (for the crash journal and drains)."""

    @abstractmethod
    def running(self) -> int: ...

    @abstractmethod
    def waiting(self) -> int: ...

    async def drain(self, mode: str, timeout_s: float) -> tuple[list[GenerationResult], bool]:
        """Stop admitting; wait for in-flight work (mode wait) up to timeout_s, then abort the rest."""
        self.state = "draining"
        deadline = time.monotonic() + (timeout_s if mode == "wait" else 0.0)
        while self.running() + self.waiting() > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        in_time = self.running() + self.waiting() == 0
        aborted = await self.abort_all()
        return aborted, in_time

    @abstractmethod
    async def sleep(self, level: int) -> None: ...

    @abstractmethod
    async def wake(self) -> None: ...

    @abstractmethod
    async def load_weights(self, version: int, data: bytes) -> None:
        """Install weights `version` from safetensors bytes (never pickle)."""

    # ---- observation
    def stats(self, epoch: int = 0) -> WorkerStats:
        c = self.counters
        iters = list(c.iteration_s)
        return WorkerStats(
            worker_id=self.worker_id,
            engine=self.kind,
            role=self.role,
            state=self.state,
            weight_version=self.weight_version,
            running_batch=self.running(),
            waiting=self.waiting(),
            decode_iterations=c.decode_iterations,
            decode_iteration_s_mean=sum(iters) / len(iters) if iters else 0.0,
            prefill_tokens=c.prefill_tokens,
            prefill_s_total=c.prefill_s_total,
            generated_tokens=c.generated_tokens,
            tokens_per_s=c.tokens_per_s(),
            kv_bytes_out=self.kv.bytes_out,
            kv_bytes_in=c.kv_bytes_in,
            kv_handles=len(self.kv),
            epoch=epoch,
        )

    def take_telemetry(self, limit: int = 2048) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while self.telemetry and len(out) < limit:
            out.append(self.telemetry.popleft().to_json())
        return out


class LoopEngine(Engine):
    """An engine driven by one background scheduling loop (continuous batching): requests queue up,
    `_wake()` tells the loop there is work, and the loop runs iterations until it is idle again."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self._work: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._closed = False

    async def start(self) -> None:
        self._work = asyncio.Event()
        self._task = asyncio.create_task(self._loop())
        self._task.add_done_callback(self._loop_ended)

    def _loop_ended(self, task: asyncio.Task) -> None:
        """A crashed scheduling loop would hang every request quietly: say so in the worker's log."""
        if not task.cancelled() and task.exception() is not None:
            logging.getLogger(__name__).error("engine loop crashed", exc_info=task.exception())

    async def shutdown(self) -> None:
        self._closed = True
        if self._work:
            self._work.set()
        if self._task:
            await asyncio.gather(self._task, return_exceptions=True)

    def _wake(self) -> None:
        assert self._work is not None, "engine not started"
        self._work.set()

    @abstractmethod
    async def _loop(self) -> None: ...
