"""The data plane's one client family, one client per server: `WorkerClient` (an engine worker,
`agents.worker`: the rollout driver's turns, the gateway's turns, the node agent's control verbs),
`TrainerClient` (the trainer, `agents.trainer.server`: samples, updates, health) and `fetch_weights` (a
weight store's snapshots, what a worker pulls).

Every request is built from a `dp.*` type and every answer parsed into one, through the one wire codec
(`dp.DATA_PLANE`): no raw dict crosses the process boundary. Every call carries the target's secret (a
job's workers and trainer: the job's data-plane token); the KV pull of a disaggregated turn carries only
the per-handle capability token. Bodies are JSON through orjson: a turn's body carries its whole context
as token ids (tens of thousands). A server that answers with a status other than 200 raises
`WorkerCallError` (its `ErrorReply`'s detail in the text); one that cannot be reached raises what aiohttp
raises (`aiohttp.ClientError`, `OSError`, `asyncio.TimeoutError`), see `UNREACHABLE`; an answer that does
not parse raises `WireError`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
from aiohttp import ClientError, ClientSession, ClientTimeout
from yarl import URL

from agents import dataplane as dp
from agents.engines.base import EngineError, EngineNotFound
from controlplane.core.wire import ErrorReply, WireError

T = TypeVar("T")

# what a call to a worker that is gone (or going) raises besides WorkerCallError
UNREACHABLE: tuple[type[BaseException], ...] = (
    ClientError,
    asyncio.TimeoutError,
    OSError,
    orjson.JSONDecodeError,
    WireError,
)


class WorkerCallError(RuntimeError):
    """The worker answered with an error status (refused: draining, weights too old, bad request...)."""

    def __init__(self, status: int, message: str, endpoint: str) -> None:
        super().__init__(f"{endpoint}: HTTP {status}: {message}")
        self.status = status
        self.endpoint = endpoint


def _answer(status: int, raw: bytes, endpoint: str) -> dict[str, Any]:
    if status != 200:
        try:
            why = dp.DATA_PLANE.parse(dp.DATA_PLANE.decode(raw), ErrorReply).detail
        except WireError:  # not an ErrorReply (a proxy's page, aiohttp's own 413 text)
            why = raw[:200].decode(errors="replace")
        raise WorkerCallError(status, why, endpoint)
    data = dp.DATA_PLANE.decode(raw)
    if not isinstance(data, dict):
        raise WireError(f"{endpoint}: a JSON object was expected")
    return data


@dataclass
class WorkerClient:
    """One engine worker's data plane, over a shared aiohttp session."""

    endpoint: str  # http://127.0.0.1:PORT
    secret: str
    session: ClientSession
    # a driver sends thousands of turns a second through a few clients: each verb's URL is parsed once
    _urls: dict[str, URL] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def headers(self) -> dict[str, str]:
        return {dp.AUTH_HEADER: f"Bearer {self.secret}"}

    def _url(self, verb: str) -> URL:
        url = self._urls.get(verb)
        if url is None:
            url = self._urls[verb] = URL(f"{self.endpoint}/{verb}")
        return url

    async def call(self, verb: str, body: dict[str, Any] | None = None, *, epoch: int | None = None) -> dict[str, Any]:
        """POST `body` to `/<verb>` (a control verb carries the agent's fencing `epoch`). The typed verbs
        below go through it; tests call it directly to probe what a server refuses."""
        headers = {dp.AUTH_HEADER: f"Bearer {self.secret}", "Content-Type": "application/json"}
        if epoch is not None:
            headers[dp.EPOCH_HEADER] = str(epoch)
        async with self.session.post(self._url(verb), data=orjson.dumps(body or {}), headers=headers) as resp:
            return _answer(resp.status, await resp.read(), self.endpoint)

    async def get(self, what: str) -> dict[str, Any]:
        async with self.session.get(f"{self.endpoint}/{what}", headers=self.headers) as resp:
            return _answer(resp.status, await resp.read(), self.endpoint)

    async def _post(self, verb: str, req: Any, answer: type[T], epoch: int | None = None) -> T:
        data = await self.call(verb, dp.DATA_PLANE.dump(req), epoch=epoch)
        parsed: T = dp.DATA_PLANE.parse(data, answer)
        return parsed

    async def _get(self, what: str, answer: type[T]) -> T:
        parsed: T = dp.DATA_PLANE.parse(await self.get(what), answer)
        return parsed

    # ---- turns (the rollout driver, the gateway)
    async def generate(self, req: dp.GenerateRequest) -> dp.GenerationResult:
        return await self._post("generate", req, dp.GenerationResult)

    async def prefill(self, req: dp.GenerateRequest) -> dp.PrefillResult:
        return await self._post("prefill", req, dp.PrefillResult)

    async def decode(self, req: dp.DecodeRequest) -> dp.GenerationResult:
        return await self._post("decode", req, dp.GenerationResult)

    # ---- control verbs (the node agent), fenced by its `epoch`
    async def drain(self, req: dp.DrainRequest, epoch: int | None = None) -> dp.DrainResult:
        return await self._post("drain", req, dp.DrainResult, epoch)

    async def sleep(self, req: dp.SleepRequest, epoch: int | None = None) -> dp.Health:
        return await self._post("sleep", req, dp.Health, epoch)

    async def wake(self, epoch: int | None = None) -> dp.Health:
        return await self._post("wake", dp.ResumeRequest(), dp.Health, epoch)

    async def resume(self, epoch: int | None = None) -> dp.Health:
        return await self._post("resume", dp.ResumeRequest(), dp.Health, epoch)

    async def set_role(self, req: dp.SetRoleRequest, epoch: int | None = None) -> dp.Health:
        return await self._post("role", req, dp.Health, epoch)

    async def load_weights(self, req: dp.LoadWeightsRequest, epoch: int | None = None) -> dp.Health:
        return await self._post("weights", req, dp.Health, epoch)

    # ---- observation
    async def health(self) -> dp.Health:
        return await self._get("health", dp.Health)

    async def stats(self) -> dp.WorkerStats:
        return await self._get("stats", dp.WorkerStats)

    async def telemetry(self) -> dp.TelemetryRecords:
        return await self._get("telemetry", dp.TelemetryRecords)

    async def inflight(self) -> dp.InflightRequests:
        return await self._get("inflight", dp.InflightRequests)


@dataclass
class TrainerClient:
    """A job's trainer: the rollout driver's samples and updates, the node agent's health checks. The
    same calls as a worker's (`WorkerClient`): the trainer is a worker of its job, with its own verbs."""

    endpoint: str
    secret: str
    session: ClientSession

    def _worker(self) -> WorkerClient:
        return WorkerClient(self.endpoint, self.secret, self.session)

    async def submit_samples(self, req: dp.SubmitSamples) -> dp.SamplesKept | dp.SamplesQueued:
        """Samples for a rollout step's update (`req.step` >= 0: buffered) or for the queue."""
        data = await self._worker().call("samples", dp.DATA_PLANE.dump(req))
        answer = dp.SamplesKept if "buffered" in data else dp.SamplesQueued
        parsed: dp.SamplesKept | dp.SamplesQueued = dp.DATA_PLANE.parse(data, answer)
        return parsed

    async def buffered(self) -> dp.BufferedSamples:
        """The finished trajectories the trainer holds for the steps it has not trained (a restarted driver's
        recovery: they count as finished, not run again)."""
        return await self._worker()._get("samples", dp.BufferedSamples)

    async def update_step(self, req: dp.StepRequest) -> dp.UpdateAnswer:
        """A rollout step's update (`req.step` >= 0), exactly once: asked again (a restarted driver), it
        answers with the version that update published."""
        if req.step < 0:
            raise ValueError("update_step: give the rollout step (>= 0); update_queued trains the queue")
        return await self._worker()._post("step", req, dp.UpdateAnswer)

    async def update_queued(self, req: dp.StepRequest) -> dp.QueuedUpdateAnswer:
        """An update on what `submit_samples` queued (a full batch, or everything with `req.all`)."""
        return await self._worker()._post("step", req, dp.QueuedUpdateAnswer)

    async def health(self) -> dp.Health:
        return await self._worker().health()

    async def stats(self) -> dp.TrainerStats:
        return await self._worker()._get("stats", dp.TrainerStats)


async def generate_disaggregated(
    prefill: WorkerClient, decode: WorkerClient, req: dp.GenerateRequest
) -> dp.GenerationResult:
    """One request through a prefill worker, then the KV hand-off to a decode worker (tests, benchmarks)."""
    pre = await prefill.prefill(req)
    if (pre.first_token == 257 and req.sampling.stop_at_eos) or req.sampling.max_tokens == 1:
        # nothing to decode: the prefill worker's first token is the whole output
        return dp.GenerationResult(
            request_id=req.request_id,
            tokens=[pre.first_token],
            logprobs=[pre.first_logprob],
            finish_reason="stop" if pre.first_token == 257 else "length",
            prompt_len=pre.prompt_len,
            weight_version=pre.weight_version,
            worker_id=pre.worker_id,
        )
    return await decode.decode(
        dp.DecodeRequest(
            request_id=req.request_id,
            kv_url=prefill.endpoint,
            handle=pre.handle,
            kv_token=pre.kv_token,
            sampling=req.sampling,
            min_weight_version=req.min_weight_version,
            job=req.job,
        )
    )


def session(timeout_s: float = 600.0) -> ClientSession:
    return ClientSession(timeout=ClientTimeout(total=timeout_s))


async def fetch_weights(session: ClientSession, url: str, version: int, token: str) -> tuple[int, bytes]:
    """Pull `version` (0 = latest) from a weight store at `url` (the base that has /weights/...): its
    index parsed into `dp.WeightsIndex`, the snapshot as safetensors bytes (never parsed here)."""
    base = url.rstrip("/") + "/weights"
    headers = {dp.AUTH_HEADER: f"Bearer {token}"} if token else {}
    try:
        if version == 0:
            async with session.get(f"{base}/latest", headers=headers) as resp:
                if resp.status != 200:
                    raise EngineError(f"weight store {url} answered HTTP {resp.status}", 502)
                try:
                    index = dp.DATA_PLANE.parse(dp.DATA_PLANE.decode(await resp.read()), dp.WeightsIndex)
                except WireError as exc:
                    raise EngineError(f"weight store {url}: {exc}", 502) from exc
            if not index.versions:
                raise EngineNotFound(f"weight store {url} has no snapshot yet")
            version = index.version
        async with session.get(f"{base}/{version}", headers=headers) as resp:
            if resp.status == 404:
                raise EngineNotFound(f"unknown weight version {version} at {url}")
            if resp.status != 200:
                raise EngineError(f"weight store {url} answered HTTP {resp.status}", 502)
            try:
                data = await dp.read_capped(resp.content, dp.MAX_WEIGHT_BYTES)
            except WireError as exc:
                raise EngineError(f"weights too large: {exc}", 413) from exc
            got = int(resp.headers.get(dp.WEIGHT_VERSION_HEADER, version))
            if got != version:
                raise EngineError(f"asked for weight version {version}, got {got}", 502)
            return version, data
    except ClientError as exc:
        raise EngineError(f"weight pull from {url} failed: {exc}", 502) from exc
