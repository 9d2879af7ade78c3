"""Where the gateway's turns are sampled: a `Backend` turns a prompt (token ids) into one complete turn.

* `WorkerBackend`: engine workers' data plane directly (a standalone gateway, the tests, the benchmark).
  A turn aborted by a drain, a return or a dying worker is resumed from its partial prefix on the next
  worker and answered once, complete.
* Inside a job, the rollout driver samples the turn (`agents.envs.agent`): routing, PD, borrowing,
  preemption resume and staleness stay the driver's.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import zlib
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from agents.dataplane import MAX_NEW_TOKENS

log = logging.getLogger("pearl.gateway")


@dataclass(slots=True)
class Sampling:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None


@dataclass(slots=True)
class Generation:
    tokens: list[int]
    logprobs: list[float]
    finish_reason: str  # stop | length
    weight_version: int  # the oldest weights that produced any of these tokens
    workers: list[int] = field(default_factory=list)  # every worker that produced part of the turn


class Backend(Protocol):
    model: str

    async def generate(self, session: Any, prompt: list[int], new: list[int], sampling: Sampling) -> Generation:
        """Sample one turn after `prompt` (whose last `len(new)` tokens are new since the previous turn)."""

    def weight_version(self) -> int: ...


class Unavailable(RuntimeError):
    """No worker finished the turn within `give_up_s` (the gateway keeps trying until then)."""


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
        self.model = model
        self.job = job
        self.give_up_s = give_up_s
        self._rr = itertools.count()
        self._seen_version = 0

    def weight_version(self) -> int:
        return self._seen_version

    async def _post(self, endpoint: str, body: dict[str, Any]) -> dict[str, Any] | None:
        from aiohttp import ClientError

        try:
            async with self.http.post(
                f"{endpoint}/generate",
                data=orjson.dumps(body),
                headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
            ) as resp:
                data = orjson.loads(await resp.read())
                if resp.status == 200:
                    return data
                log.info("worker %s refused a turn: HTTP %d %s", endpoint, resp.status, str(data)[:200])
        except (TimeoutError, ClientError, OSError, orjson.JSONDecodeError) as exc:
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
            body = {
                "request_id": f"gw-{zlib.crc32(key.encode()):08x}-{turn}-{attempt}",
                "prompt_tokens": prompt + kept,
                "sampling": {
                    "max_tokens": max(1, min(sampling.max_tokens - len(kept), MAX_NEW_TOKENS)),
                    "temperature": sampling.temperature,
                    "top_p": sampling.top_p,
                    "seed": seed % (2**62),
                    "stop_at_eos": True,
                },
                "job": self.job,
            }
            res = await self._post(self.endpoints[endpoint_i], body)
            attempt += 1
            if res is not None:
                kept += list(res["tokens"])
                kept_lps += list(res["logprobs"])
                v = int(res.get("weight_version", 0))
                version = v if version is None else min(version, v)
                self._seen_version = max(self._seen_version, v)
                workers.append(int(res.get("worker_id", endpoint_i)))
                if res["finish_reason"] != "abort":
                    state["worker"] = endpoint_i
                    return Generation(kept, kept_lps, res["finish_reason"], version, workers)
                if len(kept) >= sampling.max_tokens:
                    return Generation(kept, kept_lps, "length", version, workers)
            if loop.time() > deadline:
                raise Unavailable(f"no worker finished the turn in {self.give_up_s:.0f} s")
            await asyncio.sleep(min(1.0, 0.05 * attempt))
