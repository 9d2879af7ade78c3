"""The environment interface and its registry: what every environment module imports (the package's
`__init__` loads the built-in environments, which import this module, so nothing imports back)."""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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
    failed trajectory, which the loop restarts on its task; never a made-up reward. A `final` failure is not
    restarted: the trajectory leaves its step's batch (its group trains with the members it has left)."""

    final: bool = False


class Environment(abc.ABC):
    """One episode of one task."""

    temperature: float = 1.0  # sampling temperature the driver uses for this environment's turns
    stop_at_eos: bool = False  # a turn ends at EOS (an external agent's answer does) rather than at its budget

    def observe(self, logprobs: list[float], weight_version: int, workers: list[int]) -> None:  # noqa: B027 (optional hook)
        """The sampled turn's log-probs, weights and the workers that served it (in order: a turn resumed on
        another worker lists each), just before `step` (an external agent's record keeps them)."""

    def take_context(self) -> list[int] | None:
        """After `step`: a context that replaces the driver's (an agent rewrote its history), once."""
        return None

    def snapshot(self) -> dict[str, Any] | None:
        """The episode's state after a turn, as JSON, from which `restore` continues it in a fresh environment
        of the same task (the driver journals it per turn, so a restarted driver resumes the trajectory rather
        than run it again). None (the default): the episode cannot be restored (its state lives outside this
        object, e.g. an agent's process or a sandbox), and a restarted driver reruns it from its prompt."""
        return None

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from `snapshot()`'s state, in place of `reset()` (only called where `snapshot` gave one)."""
        raise NotImplementedError(f"{type(self).__name__} cannot be restored")

    async def aclose(self, why: str = "aborted") -> None:  # noqa: B027 (an optional hook, not abstract)
        """The trajectory was aborted or the job stops: end what the episode runs (an agent's processes)."""

    @abc.abstractmethod
    async def reset(self) -> Turn: ...

    @abc.abstractmethod
    async def step(self, response: list[int]) -> Turn: ...


Factory = Callable[..., Environment]  # factory(task=, member=, seed=, time_factor=, max_tokens=, group_size=,
#   step=, group=, batch_size=, **_) -> Environment; accept **_: later keywords may be added
REGISTRY: dict[str, Factory] = {}


def register(name: str, factory: Factory) -> None:
    """Make an environment available to jobs as `environment: <name>`."""
    REGISTRY[name] = factory


def text(s: str) -> list[int]:
    return TOKENIZER.encode(s, add_bos=False)


__all__ = ["REGISTRY", "Environment", "EnvironmentFailed", "Factory", "Turn", "register", "text"]
