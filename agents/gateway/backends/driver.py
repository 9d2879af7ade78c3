"""The gateway's backend inside a job: an agent's request becomes the pending turn of its trajectory's
environment (`agents.envs.agent.AgentEnvironment`), which the rollout driver samples: routing, PD,
borrowing, preemption resume and staleness stay the driver's."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from agents.gateway.backends.base import BackendUnavailable, Generation, Sampling
from agents.gateway.sessions import Session


@dataclass
class Pending:
    """An agent's request waiting for the driver to sample its turn."""

    prompt: list[int]
    sampling: Sampling
    answer: asyncio.Future[Generation]


class DriverBackend:
    """The gateway's backend inside a job: a request becomes the pending turn of its trajectory's
    environment, which the rollout driver samples (`AgentEnvironment.step` answers it)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.version = 0

    def weight_version(self) -> int:
        return self.version

    async def generate(self, session: Session, prompt: list[int], new: list[int], sampling: Sampling) -> Generation:
        if session.closed:  # its trajectory ended (the agent's request came after): answered, not queued
            raise BackendUnavailable(f"trajectory {session.trajectory} has ended")
        queue: asyncio.Queue[Pending] = session.backend_state
        fut: asyncio.Future[Generation] = asyncio.get_running_loop().create_future()
        queue.put_nowait(Pending(list(prompt), sampling, fut))
        return await fut
