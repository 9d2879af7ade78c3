"""The emulated trainer: an update takes a hardware x model profile's training time (no model is trained)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import torch

from agents import dataplane as dp
from agents.trainer.base import UpdateStats
from agents.trainer.grpo import GRPOConfig
from agents.weights import WeightStore, atomic_write


class EmulatedTrainer:
    """A trainer for models this machine cannot train (Qwen3-8B, Qwen3-30B-A3B on logical CPU slots):
    an update takes the profile's training-step time for the batch's tokens on the job's training GPUs
    (`Profile.train_step_s`, FSDP2-like, PROFILES.md), scaled by the run's time factor; each update
    publishes a new (placeholder) weight version that emulated workers pull and time like real weights."""

    trains_on_tokens = False

    def __init__(
        self,
        *,
        model: str,
        hardware: str,
        tp: int,
        time_factor: float,
        store: WeightStore,
        ckpt_dir: Path | None,
        job: str = "",
        batch_size: int = GRPOConfig.batch_size,
    ) -> None:
        from controlplane.core.profiles import get_profile

        self.profile = get_profile(hardware, model, tp=max(1, tp))
        self.time_factor = time_factor
        self.store: WeightStore = store
        self.batch_size = batch_size
        self.ckpt_dir = ckpt_dir
        self.job = job
        self.version = self.steps = self.stale_rejected = self.consumed = 0
        self.trained_steps: dict[int, int] = {}
        if ckpt_dir is not None and (ckpt_dir / "emulated.json").exists():
            meta = json.loads((ckpt_dir / "emulated.json").read_text())
            self.version, self.steps, self.consumed = meta["version"], meta["steps"], meta["consumed"]
            self.trained_steps = {int(k): int(v) for k, v in meta.get("trained_steps", {}).items()}
        versions = store.versions()
        self.version = max(self.version, versions[-1] if versions else 0)
        if not versions or versions[-1] < self.version:
            self.publish()

    def publish(self) -> None:
        self.store.publish(self.version, {"version": torch.tensor([self.version])})

    async def update(
        self, samples: list[dp.TrainSample], rollout_step: int | None = None, training_gpus: int = 1
    ) -> UpdateStats:
        """The update's duration for the batch's tokens (token counts: the driver sends no tokens).
        A multi-turn trajectory comes as one sample per turn, each carrying the whole context so far;
        its tokens are counted once (its largest sample: the full trajectory), as the loop's STEP
        `train_tokens` and the simulator count them, not once per turn."""
        t0 = time.perf_counter()
        per_trajectory: dict[str, int] = {}
        for i, s in enumerate(samples):
            key = s.trajectory or f"#{i}"
            n = s.token_count or len(s.prompt_tokens) + len(s.completion_tokens)
            per_trajectory[key] = max(per_trajectory.get(key, 0), n)
        tokens = sum(per_trajectory.values())
        await asyncio.sleep(self.profile.train_step_s(tokens, max(1, training_gpus)) * self.time_factor)
        self.version += 1
        self.steps += 1
        self.consumed += len(samples)
        if rollout_step is not None:
            self.trained_steps[rollout_step] = self.version
        if self.ckpt_dir is not None:
            self.ckpt_dir.mkdir(parents=True, exist_ok=True)
            atomic_write(
                self.ckpt_dir / "emulated.json",
                json.dumps(
                    {
                        "version": self.version,
                        "steps": self.steps,
                        "consumed": self.consumed,
                        "trained_steps": {str(k): v for k, v in self.trained_steps.items()},
                    }
                ).encode(),
            )
        self.publish()
        mean_reward = sum(s.reward for s in samples) / max(1, len(samples))
        return UpdateStats(self.version, 0.0, 0.0, mean_reward, len(samples), 0, 0.0, time.perf_counter() - t0)
