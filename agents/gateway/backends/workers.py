"""The gateway's backend outside a job: engine workers' data plane directly (a standalone gateway, the
tests, the benchmark), through the data plane's one client (`agents.worker_client.WorkerClient`). A turn
aborted by a drain, a return or a dying worker is resumed from its partial prefix on the next worker and
answered once, complete."""

from __future__ import annotations

import asyncio
import itertools
import logging
import zlib
from typing import Any

from agents import dataplane as dp
from agents.gateway.backends.base import BackendUnavailable, Generation, Sampling
from agents.worker_client import UNREACHABLE, WorkerCallError, WorkerClient

log = logging.getLogger("pearl.gateway")


class WorkerBackend:
    """Engine workers' `/generate`, sticky per session (its prefix cache), the next worker on failure."""

    def __init__(
        self,
        endpoints: list[str],
        token: str,
        http: Any,
        *,
        model: str = "tiny",
        give_up_s: float = 300.0,
        job: str = "",
    ) -> None:
        if not endpoints:
            raise ValueError("at least one worker endpoint")
        self.endpoints = list(endpoints)
        self.token = token
        self.http = http
        self.clients = {e: WorkerClient(e, token, http) for e in self.endpoints}
        self.model = model
        self.job = job
        self.give_up_s = give_up_s
        self._rr = itertools.count()
        self._seen_version = 0

    def weight_version(self) -> int:
        return self._seen_version

    async def _generate(self, endpoint: str, req: dp.GenerateRequest) -> dp.GenerationResult | None:
        try:
            return await self.clients[endpoint].generate(req)
        except WorkerCallError as exc:
            log.info("worker %s refused a turn: %s", endpoint, exc)
        except UNREACHABLE as exc:
            log.info("worker %s unreachable: %r", endpoint, exc)
        return None

    async def generate(self, session: Any, prompt: list[int], new: list[int], sampling: Sampling) -> Generation:
        state: dict[str, Any] = {}
        if session is not None:
            if not isinstance(session.backend_state, dict):
                session.backend_state = {}
            state = session.backend_state
        kept: list[int] = []
        kept_lps: list[float] = []
        workers: list[int] = []
        version: int | None = None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.give_up_s
        attempt = 0
        start = state.get("worker", next(self._rr) % len(self.endpoints))
        key = getattr(session, "key", "")
        turn = len(session.turns) if session is not None else 0
        while True:
            endpoint_i = (start + attempt) % len(self.endpoints)
            seed = sampling.seed if sampling.seed is not None else zlib.crc32(f"{key}-{turn}-{attempt}".encode())
            req = dp.GenerateRequest(
                request_id=f"gw-{zlib.crc32(key.encode()):08x}-{turn}-{attempt}",
                prompt_tokens=prompt + kept,
                sampling=dp.SamplingParams(
                    max_tokens=max(1, min(sampling.max_tokens - len(kept), dp.MAX_NEW_TOKENS)),
                    temperature=sampling.temperature,
                    top_p=sampling.top_p,
                    seed=seed % (2**62),
                    stop_at_eos=True,
                ),
                job=self.job,
            )
            res = await self._generate(self.endpoints[endpoint_i], req)
            attempt += 1
            if res is not None:
                kept += res.tokens
                kept_lps += res.logprobs
                v = res.weight_version
                version = v if version is None else min(version, v)
                self._seen_version = max(self._seen_version, v)
                workers.append(res.worker_id)
                if res.finish_reason != "abort":
                    state["worker"] = endpoint_i
                    return Generation(kept, kept_lps, res.finish_reason, version, workers)
                if len(kept) >= sampling.max_tokens:
                    return Generation(kept, kept_lps, "length", version, workers)
            if loop.time() > deadline:
                raise BackendUnavailable(f"no worker finished the turn in {self.give_up_s:.0f} s")
            await asyncio.sleep(min(1.0, 0.05 * attempt))
