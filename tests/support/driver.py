"""What a rollout driver talks to in the driver unit tests: its job (`JobView`, as the control plane sends it), a
link that keeps every report, and a trainer that holds some finished trajectories."""

from __future__ import annotations

from typing import Any

from agents import dataplane as dp
from controlplane.core import driver_link as dl


def job_view(**overrides: Any) -> dl.JobView:
    """A small calculator job on the emulated engine (B = 4 in groups of 2, staleness 1); `overrides` win."""
    fields: dict[str, Any] = {
        "name": "j",
        "environment": "calculator",
        "model": "tiny",
        "engine": "emulated",
        "batch_size": 4,
        "group_size": 2,
        "max_staleness": 1,
        "max_trajectory_tokens": 4096,
        "return_deadline_s": 30.0,
    }
    return dl.JobView(**(fields | overrides))


class Sink:
    """A link that takes every report."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    async def send(self, msg: Any) -> None:
        self.sent.append(msg)


def holding(finished: dict[str, float]) -> Any:
    """The trainer's answer to `GET /samples` (a driver's `_trainer_call`): it holds these finished trajectories
    (name -> reward)."""

    async def call(verb: str, fn: Any) -> dp.BufferedSamples:
        assert verb == "samples"
        held = [dp.BufferedTrajectory(int(t.split("-")[0][1:]), t, r, 0) for t, r in finished.items()]
        return dp.BufferedSamples(held, 0)

    return call
