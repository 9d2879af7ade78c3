"""The driver records every worker that served a turn, in order (issue 19): a turn aborted on one worker (drain,
return) keeps its prefix and is finished on another; a PD turn is prefilled on one worker (its first token) and
decoded on another. The environment (an external agent's record) gets the whole chain, not the last worker."""

from __future__ import annotations

import asyncio
from typing import Any

from agents import dataplane as dp
from agents.driver.episodes import Episode, EpisodeRunner
from agents.envs.base import Environment, Turn


class Recording(Environment):
    def __init__(self) -> None:
        self.served: list[list[int]] = []

    async def reset(self) -> Turn:
        return Turn([1, 2], max_tokens=8)

    def observe(self, logprobs: list[float], weight_version: int, workers: list[int]) -> None:
        self.served.append(list(workers))

    async def step(self, response: list[int]) -> Turn:
        return Turn([9], max_tokens=8)


class Runner(EpisodeRunner):
    def __init__(self) -> None:
        self.episodes: dict[str, Episode] = {}
        self.fed: list[Any] = []

    def _now(self) -> float:
        return 0.0

    def _feed(self, ev: Any) -> None:
        self.fed.append(ev)


def _result(tokens: list[int], finish: str, worker: int) -> dp.GenerationResult:
    return dp.GenerationResult("r", tokens, [-0.5] * len(tokens), finish, 2, 0, worker)


def test_a_resumed_turn_and_a_pd_turn_list_every_worker_that_served_them() -> None:
    async def main() -> tuple[Recording, Episode]:
        r, env = Runner(), Recording()
        ep = r.episodes["s0-t0"] = Episode("s0-t0", 0, 0, env)
        # turn 1: prefilled on 3, decoding on 5 is returned mid-turn (abort), resumed and finished on 7
        await r._generated(ep, 5, _result([10, 11], "abort", 5), 0, source=3)
        assert ep.kept == [10, 11] and ep.kept_workers == [3, 5] and not env.served
        await r._generated(ep, 7, _result([12], "length", 7), 0)
        # turn 2: aborted on 7 before any token, then resumed on 7 and finished there: one stretch, one worker
        await r._generated(ep, 7, _result([], "abort", 7), 0)
        await r._generated(ep, 7, _result([13], "length", 7), 0)
        return env, ep

    env, ep = asyncio.run(main())
    assert env.served == [[3, 5, 7], [7]]
    assert ep.kept_workers == [] and [s["completion_tokens"] for s in ep.samples] == [[10, 11, 12], [13]]
