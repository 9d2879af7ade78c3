"""Environments behind one small async interface, chosen by a job's `environment`.

An `Environment` is one episode of one task: `reset()` gives the first prompt and how many tokens
the policy may answer with; `step(response)` runs the policy's turn (a tool call, an answer, a
patch) and gives the next observation, or the end of the trajectory with its reward. The rollout
driver runs one per trajectory, concurrently; a step may await tools (network, subprocesses, a
sandbox) or run CPU work in a thread, but it never blocks the driver's event loop.

Plug your own in with `register("name", factory)`; a factory builds the environment of task
`task` (the same for every member of a GRPO group) from a seed.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Callable

from agents.tokenizer import TOKENIZER


@dataclass(frozen=True, slots=True)
class Turn:
    """What the environment hands the policy: tokens to append to the context, then either the next
    turn's budget or the end of the trajectory with its reward."""

    observation: list[int]  # prompt tokens appended to the context (the first prompt on reset)
    max_tokens: int = 16  # the policy's response budget for the coming turn
    done: bool = False
    reward: float = 0.0
    info: dict[str, float] = field(default_factory=dict)  # e.g. {"correct": 1.0} for the dashboard


class EnvironmentFailed(RuntimeError):
    """The episode cannot go on (an external agent crashed, timed out, gave no reward): the driver reports a
    failed trajectory, which the loop restarts on its task; never a made-up reward."""


class Environment(abc.ABC):
    """One episode of one task."""

    temperature: float = 1.0  # sampling temperature the driver uses for this environment's turns
    stop_at_eos: bool = False  # a turn ends at EOS (an external agent's answer does) rather than at its budget

    def observe(self, logprobs: list[float], weight_version: int, worker: int) -> None:
        """The sampled turn's log-probs, weights and worker, just before `step` (an external agent gets them)."""

    def take_context(self) -> list[int] | None:
        """After `step`: a context that replaces the driver's (an agent rewrote its history), once."""
        return None

    async def aclose(self, why: str = "aborted") -> None:
        """The trajectory was aborted or the job stops: end what the episode runs (an agent's processes)."""

    @abc.abstractmethod
    async def reset(self) -> Turn: ...

    @abc.abstractmethod
    async def step(self, response: list[int]) -> Turn: ...


Factory = Callable[..., Environment]  # factory(task=, member=, seed=, time_factor=, max_tokens=) -> Environment
_REGISTRY: dict[str, Factory] = {}
_BUILTINS_LOADED = False


def register(name: str, factory: Factory) -> None:
    """Make an environment available to jobs as `environment: <name>`."""
    _REGISTRY[name] = factory


def known_environments() -> tuple[str, ...]:
    _load_builtins()
    return tuple(sorted(_REGISTRY))


def make_env(name: str, *, task: int, member: int = 0, seed: int = 0, time_factor: float = 1.0,
             max_tokens: int = 32768, group_size: int = 1) -> Environment:
    """Episode `member` of task `task` (every member of a GRPO group of `group_size` shares the task)."""
    _load_builtins()
    factory = _REGISTRY.get(name)
    if factory is None:
        raise ValueError(f"unknown environment {name!r}; known: {', '.join(sorted(_REGISTRY))}")
    return factory(task=task, member=member, seed=seed, time_factor=time_factor, max_tokens=max_tokens,
                   group_size=group_size)


def _load_builtins() -> None:
    global _BUILTINS_LOADED
    if not _BUILTINS_LOADED:
        _BUILTINS_LOADED = True
        from agents.envs import calculator, swe_like  # noqa: F401  (they register themselves)


def text(s: str) -> list[int]:
    return TOKENIZER.encode(s, add_bos=False)


__all__ = ["Environment", "EnvironmentFailed", "Turn", "known_environments", "make_env", "register", "text"]
