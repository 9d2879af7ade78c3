"""The one HTTP client of engine workers' data plane (`agents.worker`): the rollout driver's turns, the node
agent's control verbs, the tests and benchmarks.

Every call carries the target worker's secret (a job's workers: the job's data-plane token); the KV pull
of a disaggregated turn carries only the per-handle capability token. Bodies are JSON through orjson: a
turn's body carries its whole context as token ids (tens of thousands). A worker that answers with a
status other than 200 raises `WorkerCallError`; a worker that cannot be reached raises what aiohttp raises
(`aiohttp.ClientError`, `OSError`, `asyncio.TimeoutError`), see `UNREACHABLE`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import ClientError, ClientSession, ClientTimeout
from yarl import URL

from agents import dataplane as dp

# what a call to a worker that is gone (or going) raises besides WorkerCallError
UNREACHABLE: tuple[type[BaseException], ...] = (ClientError, asyncio.TimeoutError, OSError, orjson.JSONDecodeError)


class WorkerCallError(RuntimeError):
    """The worker answered with an error status (refused: draining, weights too old, bad request...)."""

    def __init__(self, status: int, message: str, endpoint: str) -> None:
        super().__init__(f"{endpoint}: HTTP {status}: {message}")
        self.status = status
        self.endpoint = endpoint


def _answer(status: int, raw: bytes, endpoint: str) -> dict[str, Any]:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        if status == 200:
            raise
        data = raw[:200].decode(errors="replace")
    if status != 200:
        raise WorkerCallError(
            status, str(data.get("error", "")) if isinstance(data, dict) else str(data)[:200], endpoint
        )
    if not isinstance(data, dict):
        raise orjson.JSONDecodeError(f"{endpoint}: a JSON object was expected", raw.decode(errors="replace"), 0)
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
        """POST `body` to `/<verb>` (a control verb carries the agent's fencing `epoch`)."""
        headers = {dp.AUTH_HEADER: f"Bearer {self.secret}", "Content-Type": "application/json"}
        if epoch is not None:
            headers[dp.EPOCH_HEADER] = str(epoch)
        async with self.session.post(self._url(verb), data=orjson.dumps(body or {}), headers=headers) as resp:
            return _answer(resp.status, await resp.read(), self.endpoint)

    async def get(self, what: str) -> dict[str, Any]:
        async with self.session.get(f"{self.endpoint}/{what}", headers=self.headers) as resp:
            return _answer(resp.status, await resp.read(), self.endpoint)

    async def generate(self, req: dp.GenerateRequest) -> dp.GenerationResult:
        return dp.GenerationResult(**await self.call("generate", dp.dump(req)))

    async def prefill(self, req: dp.GenerateRequest) -> dp.PrefillResult:
        return dp.PrefillResult(**await self.call("prefill", dp.dump(req)))

    async def decode(self, req: dp.DecodeRequest) -> dp.GenerationResult:
        return dp.GenerationResult(**await self.call("decode", dp.dump(req)))

    async def stats(self) -> dp.WorkerStats:
        return dp.WorkerStats(**await self.get("stats"))


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
