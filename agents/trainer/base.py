"""What a trainer is to the trainer server (`Trainer`) and what one update reports (`UpdateStats`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from agents import dataplane as dp
from agents.weights import WeightStore


@dataclass
class UpdateStats:
    version: int
    loss: float
    grad_norm: float
    mean_reward: float
    accepted: int
    rejected_stale: int
    kl: float = 0.0
    duration_s: float = 0.0


class Trainer(Protocol):
    """What the trainer server needs of a trainer: GRPO (`GRPOTrainer`, trains the model on its tokens) and
    emulated (`EmulatedTrainer`, takes a profile's update time for the samples' token counts) alike."""

    job: str
    version: int  # the weight version of the latest update (each update publishes the next one)
    steps: int  # updates done
    stale_rejected: int
    consumed: int
    trained_steps: dict[int, int]  # rollout step -> the version its update published
    trains_on_tokens: bool  # False: samples may carry a token_count instead of their tokens

    @property
    def store(self) -> WeightStore | None:
        """Where its updates are published (workers pull them from the server's /weights/)."""
        ...

    @property
    def ckpt_dir(self) -> Path | None:
        """Its checkpoints (the server keeps its per-step sample buffer there too)."""
        ...

    @property
    def batch_size(self) -> int:
        """Samples per update on the queue path (`POST /samples` without a rollout step)."""
        ...

    async def update(
        self, samples: list[dp.TrainSample], rollout_step: int | None = None, training_gpus: int = 1
    ) -> UpdateStats:
        """One update on `samples`. With `rollout_step`, the update of that step of the RL loop (recorded
        in `trained_steps`); `training_gpus` is what an emulated update is timed on."""
        ...
