"""What every gateway backend is (`Backend`) and speaks: the turn's sampling, its generation, its refusal."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


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


class BackendUnavailable(RuntimeError):
    """No backend finished the turn: no worker within `give_up_s` (the gateway keeps trying until then), or
    the trajectory it belongs to has ended."""
