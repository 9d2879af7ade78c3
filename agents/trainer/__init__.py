"""The trainer (`python -m agents.trainer`): GRPO (`grpo`), the emulated trainer (`emulated`), both
implementing `Trainer` (`base`), served over the trainer's data plane (`server`)."""

from agents.trainer.base import Trainer, UpdateStats
from agents.trainer.emulated import EmulatedTrainer
from agents.trainer.grpo import GRPOConfig, GRPOTrainer, group_advantages
from agents.trainer.server import StepBuffer, TrainerServer, main, serve

__all__ = [
    "EmulatedTrainer",
    "GRPOConfig",
    "GRPOTrainer",
    "StepBuffer",
    "Trainer",
    "TrainerServer",
    "UpdateStats",
    "group_advantages",
    "main",
    "serve",
]
