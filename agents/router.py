"""A small PD-aware client of engine workers (the rollout driver's router, minimal).

Colocated: one worker does the whole request (sticky by trajectory id). Disaggregated: prefill on a
prefill worker -> the decode worker pulls the KV cache from it -> decode. Every call carries the
target worker's secret; the KV pull carries only the per-handle capability token.
"""
from __future__ import annotations

import itertools
import zlib
from dataclasses import dataclass, field
from typing import Any

from aiohttp import ClientSession, ClientTimeout

from agents import dataplane as dp


class WorkerCallError(RuntimeError):
    def __init__(self, status: int, message: str, endpoint: str) -> None:
        super().__init__(f"{endpoint}: HTTP {status}: {message}")
        self.status = status
        self.endpoint = endpoint


@dataclass
class WorkerClient:
    endpoint: str  # http://127.0.0.1:PORT
    secret: str
    session: ClientSession

    @property
    def headers(self) -> dict[str, str]:
        return {dp.AUTH_HEADER: f"Bearer {self.secret}"}

    async def call(self, verb: str, body: dict[str, Any] | None = None, *, epoch: int | None = None) -> dict[str, Any]:
        headers = dict(self.headers)
        if epoch is not None:
            headers[dp.EPOCH_HEADER] = str(epoch)
        async with self.session.post(f"{self.endpoint}/{verb}", json=body or {}, headers=headers) as resp:
            data = await resp.json(content_type=None)
            if resp.status != 200:
                raise WorkerCallError(resp.status, data.get("error", "") if isinstance(data, dict) else str(data), self.endpoint)
            return data

    async def get(self, what: str) -> dict[str, Any]:
        async with self.session.get(f"{self.endpoint}/{what}", headers=self.headers) as resp:
            data = await resp.json(content_type=None)
            if resp.status != 200:
                raise WorkerCallError(resp.status, data.get("error", ""), self.endpoint)
            return data

    async def generate(self, req: dp.GenerateRequest) -> dp.GenerationResult:
        return dp.GenerationResult(**await self.call("generate", dp.dump(req)))

    async def prefill(self, req: dp.GenerateRequest) -> dp.PrefillResult:
        return dp.PrefillResult(**await self.call("prefill", dp.dump(req)))

    async def decode(self, req: dp.DecodeRequest) -> dp.GenerationResult:
        return dp.GenerationResult(**await self.call("decode", dp.dump(req)))

    async def stats(self) -> dp.WorkerStats:
        return dp.WorkerStats(**await self.get("stats"))


@dataclass
class PDRouter:
    """Route requests to colocated workers, or prefill -> decode pairs, round-robin."""

    colocated: list[WorkerClient] = field(default_factory=list)
    prefill: list[WorkerClient] = field(default_factory=list)
    decode: list[WorkerClient] = field(default_factory=list)
    _rr: Any = field(default_factory=itertools.count)
    kv_bytes: int = 0

    @property
    def mode(self) -> str:
        return "disaggregated" if self.prefill and self.decode else "colocated"

    async def generate(self, req: dp.GenerateRequest, *, trajectory: str = "") -> dp.GenerationResult:
        if self.mode == "colocated":
            if not self.colocated:
                raise RuntimeError("no rollout workers")
            key = zlib.crc32(trajectory.encode()) if trajectory else next(self._rr)
            return await self.colocated[key % len(self.colocated)].generate(req)
        n = next(self._rr)
        p, d = self.prefill[n % len(self.prefill)], self.decode[n % len(self.decode)]
        return await self.disaggregated(p, d, req)

    async def disaggregated(self, p: WorkerClient, d: WorkerClient, req: dp.GenerateRequest) -> dp.GenerationResult:
        pre = await p.prefill(req)
        self.kv_bytes += pre.kv_bytes
        if pre.first_token == 257 and req.sampling.stop_at_eos or req.sampling.max_tokens == 1:
            # nothing to decode: the prefill worker's first token is the whole output
            return dp.GenerationResult(
                request_id=req.request_id, tokens=[pre.first_token], logprobs=[pre.first_logprob],
                finish_reason="stop" if pre.first_token == 257 else "length", prompt_len=pre.prompt_len,
                weight_version=pre.weight_version, worker_id=pre.worker_id,
            )
        dec = dp.DecodeRequest(
            request_id=req.request_id, kv_url=p.endpoint, handle=pre.handle, kv_token=pre.kv_token,
            sampling=req.sampling, min_weight_version=req.min_weight_version, job=req.job,
        )
        return await d.decode(dec)


def session(timeout_s: float = 600.0) -> ClientSession:
    return ClientSession(timeout=ClientTimeout(total=timeout_s))
