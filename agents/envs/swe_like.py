"""A SWE-like task for the emulated engine: long and growing contexts, many turns, heavy-tailed tool
latency — the simulator's workload distributions (`controlplane.core.workload`), one definition for
both. Given its place in a rollout batch (step, group, member; the live driver gives it), a live emulated run
draws the very trajectories a simulated run of the same job and seed draws for that step, so live and
simulated throughput compare like with like.

Tokens are synthetic (the emulated engine's are too); what matters is their number per turn, the
tool time between turns and the context that keeps growing up to the job's maximum length. The tool
call sleeps on the event loop (scaled by the run's time factor), as a real sandbox call awaits I/O.
"""

from __future__ import annotations

import asyncio
import zlib
from typing import Any

from agents.dataplane import MAX_PROMPT_TOKENS
from agents.envs.base import Environment, Turn, register
from agents.tokenizer import load_tokenizer
from controlplane.core.workload import WorkloadSpec, draw_batch


def _synthetic(n: int, salt: int) -> list[int]:
    """`n` printable bytes, deterministic in `salt` (their values carry no meaning)."""
    return [32 + (salt * 131 + i * 7) % 95 for i in range(n)]


class SweLike(Environment):
    temperature = 1.0

    def __init__(
        self,
        *,
        task: int,
        member: int = 0,
        seed: int = 0,
        time_factor: float = 1.0,
        max_tokens: int = 32768,
        group_size: int = 16,
        step: int | None = None,
        group: int = 0,
        batch_size: int | None = None,
        model: str = "tiny",
        **_: object,
    ) -> None:
        length = min(max_tokens, MAX_PROMPT_TOKENS)
        if step is None:  # no place in a batch given: a group of its own, drawn by task
            spec = WorkloadSpec(batch_size=group_size, group_size=group_size, max_length=length)
            traj = draw_batch(spec, seed=seed, step=task)[member % group_size]
        else:  # the trajectory the simulator draws at this place of rollout batch `step` (same seed, same B, G)
            spec = WorkloadSpec(batch_size=batch_size or group_size, group_size=group_size, max_length=length)
            traj = draw_batch(spec, seed=seed, step=step)[group * group_size + member % group_size]
        self.turns = traj.turns
        self.k = 0
        self.time_factor = time_factor
        self.salt = zlib.crc32(f"{seed}-{task}-{member}".encode())
        # whether the "tests pass" at the end: a fixed fraction of the group's tasks, by member
        self.passes = (self.salt % 100) < 40
        bos = load_tokenizer(model).bos_id  # the byte tokenizer's, or the model directory's (Qwen's has none)
        self.bos = [] if bos is None else [bos]

    async def reset(self) -> Turn:
        t = self.turns[0]
        body = _synthetic(t.new_prompt_tokens - len(self.bos), self.salt)
        return Turn([*self.bos, *body], max_tokens=t.generated_tokens)

    def snapshot(self) -> dict[str, Any]:
        """The turn it is at (its turns are drawn from the task, seed and place in the batch)."""
        return {"k": self.k}

    def restore(self, state: dict[str, Any]) -> None:
        k = int(state["k"])
        if not 0 <= k < len(self.turns):
            raise ValueError(f"turn {k} of {len(self.turns)}")
        self.k = k

    async def step(self, response: list[int]) -> Turn:
        spent = self.turns[self.k]
        self.k += 1
        if self.k >= len(self.turns):
            return Turn([], done=True, reward=1.0 if self.passes else 0.0, info={"correct": float(self.passes)})
        await asyncio.sleep(spent.env_latency_s * self.time_factor)  # the tool runs
        nxt = self.turns[self.k]
        return Turn(_synthetic(nxt.new_prompt_tokens, self.salt + self.k), max_tokens=nxt.generated_tokens)


register("swe-like", SweLike)
