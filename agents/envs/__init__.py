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

from agents.envs.base import REGISTRY, Environment, EnvironmentFailed, Factory, Turn, register, text

_BUILTINS_LOADED = False


def known_environments() -> tuple[str, ...]:
    _load_builtins()
    return tuple(sorted(REGISTRY))


def make_env(
    name: str,
    *,
    task: int,
    member: int = 0,
    seed: int = 0,
    time_factor: float = 1.0,
    max_tokens: int = 32768,
    group_size: int = 1,
    step: int | None = None,
    group: int = 0,
    batch_size: int | None = None,
    model: str = "tiny",
) -> Environment:
    """Episode `member` of task `task` (every member of a GRPO group of `group_size` shares the task). A live
    driver also says where the episode stands in its rollout batch (`step`, `group`, `batch_size`), so an
    environment drawn from the simulator's workload can draw the very trajectory the simulator draws there.
    `model` is the job's model: a model directory's environments speak its tokenizer and chat template."""
    _load_builtins()
    factory = REGISTRY.get(name)
    if factory is None:
        raise ValueError(f"unknown environment {name!r}; known: {', '.join(sorted(REGISTRY))}")
    return factory(
        task=task,
        member=member,
        seed=seed,
        time_factor=time_factor,
        max_tokens=max_tokens,
        group_size=group_size,
        step=step,
        group=group,
        batch_size=batch_size,
        model=model,
    )


def _load_builtins() -> None:
    global _BUILTINS_LOADED
    if not _BUILTINS_LOADED:
        _BUILTINS_LOADED = True
        from agents.envs import calculator, swe_like  # noqa: F401  (they register themselves)


__all__ = ["Environment", "EnvironmentFailed", "Factory", "Turn", "known_environments", "make_env", "register", "text"]
