"""The emulated trainer times an update by the batch's tokens counted once per trajectory (the loop's
STEP train_tokens and the simulator's), not once per turn sample (each carries the context so far)."""

import asyncio
import dataclasses

from agents import dataplane as dp
from agents.trainer import EmulatedTrainer
from agents.weights import WeightStore
from controlplane.core.profiles import Profile


def test_multi_turn_trajectory_counts_its_tokens_once(tmp_path):
    t = EmulatedTrainer(
        model="qwen3-8b", hardware="H800", tp=2, time_factor=1e-9, store=WeightStore(tmp_path / "w"), ckpt_dir=None
    )
    seen: list[float] = []

    class Observed(Profile):  # the frozen core profile, its training time observed
        __slots__ = ()

        def train_step_s(self, tokens: float, gpus: int) -> float:
            seen.append(tokens)
            return 0.0

    t.profile = Observed(**{f.name: getattr(t.profile, f.name) for f in dataclasses.fields(t.profile)})

    def sample(traj, n):
        return dp.TrainSample(
            group="0-0",
            prompt_tokens=[],
            completion_tokens=[],
            logprobs=[],
            reward=0.0,
            weight_version=0,
            trajectory=traj,
            token_count=n,
        )

    # trajectory a: turns with contexts 100, 250, 400 (400 = the whole trajectory); b: one turn of 80
    asyncio.run(t.update([sample("a", 100), sample("a", 250), sample("a", 400), sample("b", 80)], 0, 4))
    assert seen == [480]
